"""The generation of an unnamed collective's name, spelled once for the worker that makes the
names (byteps/core/collective/rules.py) and the scheduler that compares ranks by them
(byteps/scheduler/deadlock.py).

A worker's unnamed calls count in a generation ``(epoch, joins, inits)``: its membership
epoch, the join()s completed in it, and the init() calls it made while already in it
(Horovod's suites call init() at the start of every test).  Every rank passes the same
join() and init() calls in the same order, so a rank whose generation is later than the
generation of a name another rank waits for has passed that point without the call, and
never makes it (the scheduler's "behind" rule).
"""
from __future__ import annotations

import re

_TAGGED = re.compile(r"\.noname\.(?:ps\d+\.)?e(\d+)j(\d+)(?:i(\d+))?\.\d")
_GIVEN = re.compile(r"~e(\d+)j(\d+)i(\d+)(?=['.]|$)")
_PLAIN = re.compile(r"\.noname\.(?:ps\d+\.)?\d")


def tag(epoch: int, joins: int, inits: int) -> str:
    """The part of an unnamed call's name that spells its generation ("" for the first)."""
    if joins == 0 == inits and epoch & 0xFFFF <= 1:
        return ""
    return f"e{epoch}j{joins}{f'i{inits}' if inits else ''}."


def given(name: str, epoch: int, joins: int, inits: int) -> str:
    """A name the user gave, as the collectives use it: unchanged until a rank already in
    the job calls init() again (Horovod's suites: every test), then with the generation
    appended, so that a rank still in an earlier test never pairs its call with a later
    test's call of the same name (Horovod's suites reuse names across tests)."""
    return name if not inits else f"{name}~e{epoch}j{joins}i{inits}"


def of_name(name: str, epoch: int) -> tuple | None:
    """The generation ``(epoch, joins, inits)`` of an unnamed call's name (as a report spells
    it: ``push_pull 'x.noname...'``), read in membership ``epoch``; None for a name the user
    gave before any init() again (it carries none)."""
    m = _TAGGED.search(name) or _GIVEN.search(name)
    if m:
        return int(m[1]), int(m[2]), int(m[3] or 0)
    if _PLAIN.search(name) and epoch & 0xFFFF <= 1:
        return epoch, 0, 0
    return None

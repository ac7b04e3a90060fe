"""What this worker's main thread waits for, for the scheduler's deadlock detection.

Ranks that wait in different collectives (rank 0 in allreduce ``a``, rank 1 in broadcast
``b``) would wait for each other forever.  Each heartbeat says whether the main thread is
blocked in a BytePS wait, on what, since when, and which names this rank has started and
not finished (api/reporter.py builds the names).  The scheduler declares a deadlock when
every live worker has been blocked for two heartbeats on the same waits and no awaited name
was started by every rank (byteps/scheduler/deadlock.py); it says so in its heartbeat
answer, and every wait of this rank then fails with ``CollectiveDeadlockError`` naming the
ranks and names (collective/handles.check_deadline).  A rank that computes, however slowly,
is not blocked, so it never trips this.  Only the main thread's waits count: a background
thread may still start what the others wait for.

Every thread's named waits are reported too, with this rank's generation (init() and join()
count, byteps/common/generation.py), for the scheduler's "behind" rule: a rank that waits in
a call of an earlier generation than another rank's, which never started it, is told so, and
its waits of that generation alone fail with ``CollectiveBehindError`` (it stays in the job).
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time

MAX_TEXT = 4000
MAX_DONE = 32

# the names (as the reports spell them) of this rank's latest finished waits, any thread: a
# name another rank still waits for has completed its round, so that rank can go on
_DONE: collections.deque = collections.deque(maxlen=MAX_DONE)

# the main thread's current waits, innermost last: [(("handle", id) | ("barrier", name), since)]
_MAIN: list = []

# every thread's current waits that have a name: {id(entry): (label, since)} (a TensorFlow
# graph waits on its inter-op threads), for the scheduler's "behind" rule
_ANY: dict = {}


@contextlib.contextmanager
def waiting(what: tuple, label: str | None = None):
    """Mark the main thread blocked on ``what`` (a handle or a barrier) meanwhile, and any
    thread waiting on ``label`` (the name as the reports spell it); when the wait ends
    without an error, ``label`` joins the finished names, whichever thread waited."""
    key = object()
    if label:
        _ANY[id(key)] = (label, time.monotonic())
    try:
        with _main(what):
            yield
            if label:
                _DONE.append(label)
    finally:
        _ANY.pop(id(key), None)


def waits() -> list:
    """[(label, seconds)] of every thread's named waits, the longest first."""
    now = time.monotonic()
    return sorted(((label, now - since) for label, since in list(_ANY.values())),
                  key=lambda w: -w[1])


@contextlib.contextmanager
def _main(what: tuple):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    entry = (what, time.monotonic())
    _MAIN.append(entry)
    try:
        yield
    finally:
        try:
            _MAIN.remove(entry)
        except ValueError:
            pass


def finished() -> list:
    """This rank's latest finished names (api/reporter.py counts them as started)."""
    return list(_DONE)


def current() -> tuple | None:
    """(what, seconds) of the main thread's innermost wait, or None when it is not blocked."""
    try:                      # (read on the engine thread while the main thread changes it)
        what, since = _MAIN[-1]
    except IndexError:
        return None
    return what, time.monotonic() - since


def on_ack(engine, body: dict) -> None:
    """The scheduler's answer to a heartbeat (engine thread): ``stacks`` (bpslaunch --stacks)
    and ``deadlock`` (the text that every wait of this rank now fails with)."""
    if body.get("stacks") is True:
        engine.link.stacks_asked = True   # the next heartbeat has them (api/reporter.py)
    text = body.get("deadlock")
    if isinstance(text, str) and text and getattr(engine, "deadlock", None) is None and _MAIN:
        engine.deadlock = text[:MAX_TEXT]   # (a main thread no longer blocked: not this rank)
    behind, gen = body.get("behind"), body.get("gen")
    if isinstance(behind, str) and behind and isinstance(gen, list) and len(gen) == 3 and \
            all(type(x) is int and 0 <= x < 2 ** 63 for x in gen):
        engine.behind = (tuple(gen), behind[:MAX_TEXT])   # collective/handles.check_deadline

"""Deadlock detection: every worker waits in a collective that another rank never started.

Rank 0 in allreduce ``a`` and rank 1 in broadcast ``b`` wait for each other forever (there
is no default collective timeout: a rank may legitimately compute for minutes while the
others wait).  Each worker's heartbeat report says whether its main thread is blocked in a
BytePS wait, on which names, for how long, and which names that rank has started and not
finished (byteps/core/engine/deadlock.py, api/reporter.py).  The scheduler declares a
deadlock when every live worker's last two heartbeats say it is blocked on the same names,
for at least two heartbeat intervals, and no awaited name was started by every live worker.
It then tells every worker (a heartbeat answer with ``deadlock``); each one fails its waits
with ``CollectiveDeadlockError`` naming the ranks and names, and leaves the membership, so
that shutdown() and init() on every rank re-form the job.  A rank that computes is not
blocked, so slow ranks never trip it; nothing is declared while a rank is in join(), while
process sets exist (an operation of a set needs only its members), or during a re-formation.

The "behind" rule (:meth:`Deadlocks.check_behind`): each heartbeat also carries the rank's
generation (init() and join() count, byteps/common/generation.py) and what any of its threads
waits for.  A rank that has waited 3 s and two heartbeats in a call of an earlier generation
than another live rank's, which never started it, is told so alone; its waits of that
generation fail and it stays, so its next init() meets the others.  No deadlock is declared
while the ranks' generations differ.
"""
from __future__ import annotations

import logging
import re
import time

from byteps.common.generation import of_name
from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")

MAX_NAMES, MAX_STARTED, MAX_NAME = 8, 256, 300
BEHIND_S = 3.0          # a rank waits this long at least before it is told it is behind
_SET = re.compile(r"\.noname\.ps\d")    # a process set's unnamed call (only its members)


def parse_gen(rep) -> tuple | None:
    """The validated ``gen`` field of a heartbeat report: the rank's ``(epoch, joins,
    inits)`` (byteps/common/generation.py); None when absent."""
    g = rep.get("gen") if isinstance(rep, dict) else None
    if g is None:
        return None
    if not isinstance(g, list) or len(g) != 3 or not all(
            type(x) is int and 0 <= x < 2 ** 63 for x in g):
        raise ValueError("field 'gen' must be a list of three non-negative integers")
    return tuple(g)


def parse_waits(rep) -> dict | None:
    """The validated ``waits`` field (every thread's named waits, the longest first, maybe
    none, and what the rank started and has not synchronized, and its latest finished names);
    None when absent."""
    w = rep.get("waits") if isinstance(rep, dict) else None
    if w is None:
        return None
    if not isinstance(w, dict):
        raise ValueError("field 'waits' must be a map")
    sets = w.get("sets", False)
    if type(sets) is not bool:
        raise ValueError("field 'waits.sets' must be true or false")
    return _fields(w, "waits", sets)


def parse(rep) -> dict | None:
    """The validated ``blocked`` field of a heartbeat report (None: not blocked); raises
    ValueError naming the bad field."""
    if not isinstance(rep, dict) or rep.get("blocked") is None:
        return None
    b = rep["blocked"]
    if not isinstance(b, dict):
        raise ValueError("field 'blocked' must be a map")
    if not b.get("names"):
        raise ValueError("field 'blocked.names' must not be empty")
    if type(b.get("sets")) is not bool:
        raise ValueError("field 'blocked.sets' must be true or false")
    return _fields(b, "blocked", b["sets"])


def _fields(m: dict, what: str, sets: bool) -> dict:
    """The names, started names and seconds of a ``blocked`` or ``waits`` map, validated."""
    names, started, secs = m.get("names"), m.get("started"), m.get("s")
    for field, value, most in (("names", names, MAX_NAMES), ("started", started, MAX_STARTED)):
        if not isinstance(value, list) or len(value) > most or not all(
                isinstance(x, str) and len(x) <= MAX_NAME for x in value):
            raise ValueError(f"field '{what}.{field}' must be a list of at most {most} "
                             f"strings of at most {MAX_NAME} characters")
    if type(secs) not in (int, float) or not 0 <= secs < 1e9:
        raise ValueError(f"field '{what}.s' must be a number of seconds")
    return {"names": tuple(names), "s": float(secs), "started": frozenset(started),
            "sets": sets}


class Deadlocks:
    """The scheduler's view of which workers are blocked, and the deadlocks it declared."""

    def __init__(self, sched):
        self.s = sched
        self.last: dict[bytes, tuple] = {}   # ident -> (received, report, previous report)
        self.declared_epoch: int | None = None
        self.declared = 0                    # deadlocks declared (tests, metrics)
        # ident -> (received, generation, waits, previous waits): the "behind" rule
        self.gens: dict[bytes, tuple] = {}
        self.told: dict[bytes, tuple] = {}   # ident -> the generation it was told to reach
        self.behind = 0                      # ranks told they are behind (tests)

    def note(self, ident: bytes, body: dict) -> None:
        """A heartbeat of a registered node (validated field by field)."""
        if ident not in self.s.workers:
            return
        try:
            b = parse(body.get("report"))
        except ValueError as exc:
            self.s.drops.warn("malformed 'blocked' report in a heartbeat", str(exc))
            b = None
        prev = self.last.get(ident)
        self.last[ident] = (time.monotonic(), b, prev[1] if prev else None)
        try:
            gen, waits = parse_gen(body.get("report")), parse_waits(body.get("report"))
        except ValueError as exc:
            self.s.drops.warn("malformed 'gen' or 'waits' report in a heartbeat", str(exc))
            gen = waits = None
        old = self.gens.get(ident)
        self.gens[ident] = (time.monotonic(), gen, waits, old[2] if old else None)

    def check(self, now: float) -> None:
        """Declare a deadlock when every live worker is blocked and none can go on."""
        s = self.s
        if not s.formed or s.rejoin or s.early_rejoin or self.declared_epoch == s.epoch or \
                (s.elastic is not None and s.elastic.pending):
            return
        live = [i for i in s.workers if i not in s.exited and i not in s.left]
        if len(live) < 2 or any(i in s.joined for i in live):
            return
        if self.check_behind(now, live):
            return                   # ranks in different generations: not a deadlock
        beat = s.cfg.heartbeat_interval
        reps = {}
        for ident in live:
            at, b, prev = self.last.get(ident, (0.0, None, None))
            if b is None or prev is None or b["sets"] or prev["names"] != b["names"] or \
                    b["s"] < 2 * beat or now - at > 2 * beat + 0.5:
                return
            reps[ident] = b
        for b in reps.values():
            if any(all(name in o["started"] for o in reps.values()) for name in b["names"]):
                return               # every rank started it: it completes (slow, not stuck)
        self.declare(reps)

    def check_behind(self, now: float, live: list) -> bool:
        """Tell each rank that waits (any thread, for ``BEHIND_S`` and two heartbeats) in a
        call of an earlier generation (the tag of its name) than another live rank's, which has not
        started it, that it is behind: that rank called init() or join() again without the
        call, so it never completes.  True when live ranks' generations differ."""
        s, beat = self.s, self.s.cfg.heartbeat_interval
        gens = {}
        for ident in live:
            at, gen, _w, _p = self.gens.get(ident, (0.0, None, None, None))
            if gen is None or now - at > 2 * beat + 0.5:
                return False
            gens[ident] = gen
        if len(set(gens.values())) < 2 or len({g[0] for g in gens.values()}) > 1:
            return False             # one generation, or a re-formation under way
        for ident in live:
            _at, gen, waits, prev = self.gens[ident]
            if waits is None or prev is None or not waits["names"] or waits["sets"] or \
                    waits["names"][:1] != prev["names"][:1] or \
                    waits["s"] < max(2 * beat, BEHIND_S) or self.told.get(ident, ()) > gen:
                continue
            name = waits["names"][0]
            mine = of_name(name, gen[0])
            if mine is None or mine[0] != gen[0] or _SET.search(name):
                continue             # a name without a tag, or a process set's: no rule
            ahead = [o for o in live if gens[o] > mine and
                     name not in (self.gens[o][2] or {}).get("started", ())]
            if ahead:
                self.tell_behind(ident, name, mine, ahead, max(gens[o] for o in ahead))
        return True

    def tell_behind(self, ident: bytes, name: str, mine: tuple, ahead: list,
                    gen: tuple) -> None:
        s = self.s
        ranks = sorted(s.workers[o].get("rank", -1) for o in ahead)
        text = (f"it waits in {name} (made after init() #{mine[2]} and join() "
                f"#{mine[1]} of membership {mine[0]}), which worker rank(s) "
                f"{', '.join(map(str, ranks))} never made: they called init() or join() "
                f"again since (now at init() #{gen[2]}, join() #{gen[1]}), so it never "
                f"completes. Every rank must call init() as often as the others and make "
                f"the same calls between two init() calls (a test that failed on some ranks "
                f"only leaves the others here)")
        log.warning("worker rank %s is behind: %s", s.workers[ident].get("rank"), text)
        self.told[ident] = gen
        self.behind += 1
        s.send(ident, Op.HEARTBEAT_ACK, {"behind": text, "gen": list(gen)})

    def declare(self, reps: dict) -> None:
        s = self.s
        order = sorted(reps, key=lambda i: s.workers[i].get("rank", -1))
        waits = "; ".join(f"rank {s.workers[i].get('rank')} waits in "
                          f"{' or '.join(reps[i]['names'])} (for {reps[i]['s']:.1f} s)"
                          for i in order)
        text = (f"deadlock: every worker waits in a collective that the other ranks never "
                f"started ({waits}); no rank can go on. Every rank must call the same "
                f"collectives with the same names in the same order")
        log.error("%s (%s)", text, ", ".join(describe(dict(s.workers[i], role="worker"))
                                             for i in order))
        self.declared_epoch = s.epoch
        self.declared += 1
        self.last.clear()
        for ident in order:
            s.send(ident, Op.HEARTBEAT_ACK, {"deadlock": text})

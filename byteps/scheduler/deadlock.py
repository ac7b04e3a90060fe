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
"""
from __future__ import annotations

import logging
import time

from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")

MAX_NAMES, MAX_STARTED, MAX_NAME = 8, 256, 300


def parse(rep) -> dict | None:
    """The validated ``blocked`` field of a heartbeat report (None: not blocked); raises
    ValueError naming the bad field."""
    if not isinstance(rep, dict) or rep.get("blocked") is None:
        return None
    b = rep["blocked"]
    if not isinstance(b, dict):
        raise ValueError("field 'blocked' must be a map")
    names, started, secs, sets = b.get("names"), b.get("started"), b.get("s"), b.get("sets")
    for field, value, most in (("names", names, MAX_NAMES), ("started", started, MAX_STARTED)):
        if not isinstance(value, list) or len(value) > most or not all(
                isinstance(x, str) and len(x) <= MAX_NAME for x in value):
            raise ValueError(f"field 'blocked.{field}' must be a list of at most {most} "
                             f"strings of at most {MAX_NAME} characters")
    if not names:
        raise ValueError("field 'blocked.names' must not be empty")
    if type(secs) not in (int, float) or not 0 <= secs < 1e9:
        raise ValueError("field 'blocked.s' must be a number of seconds")
    if type(sets) is not bool:
        raise ValueError("field 'blocked.sets' must be true or false")
    return {"names": tuple(names), "s": float(secs), "started": frozenset(started),
            "sets": sets}


class Deadlocks:
    """The scheduler's view of which workers are blocked, and the deadlocks it declared."""

    def __init__(self, sched):
        self.s = sched
        self.last: dict[bytes, tuple] = {}   # ident -> (received, report, previous report)
        self.declared_epoch: int | None = None
        self.declared = 0                    # deadlocks declared (tests, metrics)

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

    def check(self, now: float) -> None:
        """Declare a deadlock when every live worker is blocked and none can go on."""
        s = self.s
        if not s.formed or s.rejoin or s.early_rejoin or self.declared_epoch == s.epoch or \
                (s.elastic is not None and s.elastic.pending):
            return
        live = [i for i in s.workers if i not in s.exited and i not in s.left]
        if len(live) < 2 or any(i in s.joined for i in live):
            return
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

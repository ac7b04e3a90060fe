"""The worker's side of server failover (``BYTEPS_SERVER_REPLICAS=1``).

Partitions go to server ``(key + part) mod S`` (byteps.core.api); every server's backup is
the next one of the address book (byteps/server/replica.py).  When the scheduler declares
a server dead (``FAILOVER``), its partitions belong to the next live server: every
partition in flight to it is resent there in full (push and pull; the user's tensor is
kept until its result comes, so this is always possible), queued and later ones are sent
there directly.  The new owner answers a round it holds a copy of, and sums a round it
does not from the resent pushes; a rank's push of a (key, round) is never added twice.
"""
from __future__ import annotations

import logging

from byteps.common.node import BytePSError, describe, down_grace
from byteps.transport.wire import WireError, failover_body

log = logging.getLogger("byteps.worker")


class WorkerFailover:
    """Which servers are dead and where their partitions go now (engine thread only).
    ``info``: the address book's servers; ``rank``: this worker's, for messages;
    ``drops``: the engine's rate-limited log of dropped messages."""

    def __init__(self, cfg, info: list, rank: int, drops):
        self.cfg, self.info, self.rank, self.drops = cfg, info, rank, drops
        n = len(info)
        self.enabled = cfg.server_replicas > 0 and n >= 2
        self.route = list(range(n))     # server index -> index of its current owner
        self.dead: set[int] = set()
        lost = [i for i, s in enumerate(info) if s.get("lost") is True]
        if lost and self.enabled:      # a group re-formed after a failover: never greet it
            self._mark(lost[0])

    def grace(self, i: int) -> float | None:
        """How long server ``i``'s connection may stay closed before this worker gives up
        by itself (None: never; it was failed over).  With replication the scheduler
        decides: its FAILOVER (or NODE_DEAD) comes first."""
        if i in self.dead:
            return None
        g = down_grace(self.cfg)
        return g + self.cfg.heartbeat_timeout if self.enabled else g

    def _mark(self, i: int) -> int:
        """Server ``i`` is dead: its partitions (and those it took over) go to the next live
        server of the address book; returns that server's index."""
        self.dead.add(i)
        n = len(self.route)
        for k in range(n):
            j = k
            while j in self.dead:
                j = (j + 1) % n
            self.route[k] = j
        return self.route[i]

    def on_failover(self, body: dict) -> tuple[int, int, str] | None:
        """The scheduler's FAILOVER: mark the dead server; returns (its index, the index of
        its new owner, the reason), or None when there is nothing to move."""
        try:
            dead, reason = failover_body(body)
        except WireError as exc:
            return self.drops.warn("bad FAILOVER", str(exc))
        i = next((i for i, s in enumerate(self.info) if s["node_id"] == dead["node_id"]), -1)
        if i < 0:
            return self.drops.warn("FAILOVER naming no server of this job", repr(body)[:200])
        if not self.enabled:       # the scheduler and this worker disagree on the setting
            raise BytePSError(f"worker rank {self.rank}: "
                              f"{describe(dict(dead, role='server'))} "
                              f"died ({reason}) and this worker does not have "
                              f"BYTEPS_SERVER_REPLICAS=1; set it on every node")
        if i in self.dead:
            return None
        return i, self._mark(i), reason

    def take_over(self, eng, body: dict) -> None:
        """The scheduler's FAILOVER on engine ``eng``: every partition in flight to the
        dead server is resent in full to its new owner (later ones are routed there by
        :attr:`route`)."""
        found = self.on_failover(body)
        if found is None:
            return
        i, new, reason = found
        moved: list = []
        for t in eng.inflight.values():
            if t.server == i:
                t.server = new
                c = eng.links.charge(t, new)   # an acked one's credit was returned: taken again
                eng.inflight_bytes += c - (0 if t.acked else t.credit)
                t.credit = c
                t.acked, t.tries = False, 0
                moved.append(t)
        log.warning("worker rank %d: %s died (%s); its partitions go to %s: %d in flight "
                    "resent", self.rank, describe(dict(self.info[i], role="server")),
                    reason, self.info[new]["address"], len(moved))
        eng.links.held[new].update(eng.links.held[i])
        for s in range(0, len(moved), 256):
            eng.send_tasks(new, moved[s:s + 256])

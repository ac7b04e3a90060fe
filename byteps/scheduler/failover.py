"""The scheduler's side of server failover (``BYTEPS_SERVER_REPLICAS=1``).

When a server is declared dead (its connection closed and stayed closed, or its
heartbeats stopped) and replication is on, the job goes on: the scheduler tells every
live node ``FAILOVER {dead, reason}`` (its backup, the next server of the address book,
owns its keys from now on; byteps/server/replica.py, byteps/core/engine/failover.py), tells the
dead node (if it is merely unreachable) to end, and stops watching it.  Address books of a
re-formed group (``shutdown()`` and ``init()`` again, elastic membership) mark it
``lost``: new engines route around it from the start.  A second server
death, or any death without replication, ends the job as before (docs/fault_tolerance.md).
"""
from __future__ import annotations

import logging

from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")
DEAD_FIELDS = ("role", "rank", "host", "host_id", "pid", "node_id", "address")


class Failover:
    """Which server died and whether the job survives it."""

    def __init__(self, sched):
        self.sched = sched
        self.lost: dict | None = None       # the server that died (only one is survived)

    def survive(self, dead: dict, reason: str) -> bool:
        """True when the job goes on without ``dead`` (a server, with replication on and
        no server lost before); False: end the job as usual."""
        s = self.sched
        if dead.get("role") != "server" or s.cfg.server_replicas < 1 or not s.formed \
                or len(s.servers) < 2:
            return False
        ident = next((i for i, n in s.servers.items()
                      if n.get("node_id") == dead.get("node_id")), None)
        if ident is None:
            return False
        if self.lost is not None:
            log.error("a second server died (%s died before): BYTEPS_SERVER_REPLICAS=%d "
                      "survives one server's death", describe(self.lost), s.cfg.server_replicas)
            return False
        self.lost = dict(dead)
        s.exited.add(ident)                 # no more heartbeat checks, broadcasts skip it
        s.servers[ident]["lost"] = True     # later address books say so (a re-formed group)
        log.warning("%s; BYTEPS_SERVER_REPLICAS=%d: its backup server owns its keys, the "
                    "workers resend their rounds in flight, training goes on", reason,
                    s.cfg.server_replicas)
        s.send(ident, Op.TERMINATE, {"ok": False, "reason": f"declared dead: {reason}"})
        s.broadcast(Op.FAILOVER, {"dead": {k: dead.get(k) for k in DEAD_FIELDS},
                                  "reason": reason})
        reset = s.join_reset                # a join() waiting for this server's MEMBERS_OK
        if reset is not None:
            reset[1].discard(ident)
            if not reset[1]:
                s.join_done()
        return True

"""What a server tells the scheduler with each heartbeat, for the dashboard
(byteps/dashboard): keys held, bytes and rounds summed, open rounds, the summation queue,
and the replica state.  Plain numbers and short strings; the scheduler validates them field
by field (byteps/dashboard/reports.py ``clean_server``)."""
from __future__ import annotations

from byteps.server import store


def report(srv) -> dict:
    """The heartbeat report of server ``srv`` (:class:`byteps.server.Server`)."""
    pending = sum(1 for s in list(srv.slots.values()) for rs in list(s.rounds.values())
                  if rs.result is None and rs.ranks)
    rep = srv.replica
    state = ("off" if not rep.replicas else "degraded (a server died)" if rep.degraded else
             f"copies to node {rep.backup['node_id']}" + ("" if rep.ready else " (connecting)")
             if rep.backup is not None else "no backup")
    return {"keys": sum(1 for d in list(srv.decls.values()) if "shape" in d),
            "bytes": int(srv.records.bytes_received), "rounds": int(store.ROUNDS_DONE[0]),
            "open": pending, "queue": sum(q.qsize() for q in srv.queues),
            "replica": state[:80]}

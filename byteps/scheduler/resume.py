"""A restarted scheduler rebuilds its state from what the live nodes tell it.

``bpslaunch --standalone`` starts a new scheduler on the same address when the
scheduler dies of a signal (byteps/launcher/supervise.py).  The nodes' DEALER sockets
reconnect by themselves; each registered node then sends its registration again with
``resume: {node_id, rank, epoch, size}`` (byteps/common/node.py).  The new scheduler
takes every node back with its node id, rank and epoch; once every server and ``size``
workers are back, the job is formed again, without new address books: the nodes keep
theirs, and training never stopped (workers push to servers directly; only barriers,
joins and the job's end go through the scheduler, and they wait for it).

A scheduler that already formed (a node's connection blipped, the same scheduler)
ignores a resume from a node it knows and refuses one it does not.
"""
from __future__ import annotations

import logging
import time

from byteps.common.node import describe
from byteps.scheduler.registration import node_info
from byteps.transport.wire import WireError

log = logging.getLogger("byteps.scheduler")
RESUME_WAIT_S = 5.0


def adopt(s, ident: bytes, b: dict, seq: int) -> None:
    """Take back a node that registered with the previous scheduler (``b["resume"]``)."""
    r = b.get("resume")
    if not isinstance(r, dict) or not all(type(r.get(k)) is int
                                          for k in ("node_id", "rank", "epoch", "size")):
        raise WireError("registration field resume must hold int node_id, rank, epoch, size")
    if s.formed:
        if ident in s.servers or ident in s.workers:
            return                      # the same scheduler: a connection came back
        return s.refuse(ident, f"{b.get('role')} at {b.get('host')} (pid {b.get('pid')}) "
                        f"resumed after the job re-formed without it")
    info = node_info(b, seq)
    info.update(node_id=r["node_id"], rank=r["rank"], epoch=r["epoch"])
    if info["role"] == "server":
        s.servers[ident] = info
    else:
        err = s.add_worker(ident, info, s.workers, s.hosts)
        if err:
            return s.refuse(ident, f"cannot resume: {err}")
    s.resumed_size = max(s.resumed_size, r["size"])
    s.resume_since = getattr(s, "resume_since", None) or time.monotonic()
    s.epoch = max(s.epoch, r["epoch"])
    log.info("%s is back (node id %d, epoch %d)", describe(info), r["node_id"], r["epoch"])
    tick(s)


def tick(s) -> None:
    """Form again once every server and every worker is back; or, every server back,
    RESUME_WAIT_S after the first node came back, with the workers back: the others
    finished while no scheduler ran (their EXIT went to the dead one; a live worker
    reconnects within a fraction of a second)."""
    if s.formed or len(s.servers) < s.cfg.num_server:
        return
    missing = s.resumed_size - len(s.workers)
    if missing > 0 and time.monotonic() - s.resume_since < RESUME_WAIT_S:
        return
    now = time.monotonic()
    for n in list(s.servers.values()) + list(s.workers.values()):
        n["last_seen"] = now
    s.formed = True
    log.info("restarted scheduler: the job re-formed from %d server(s) and %d worker(s), "
             "epoch %d%s", len(s.servers), len(s.workers), s.epoch,
             f"; {missing} worker(s) did not come back (presumed finished)" if missing > 0
             else "")
    late(s)


def late(s) -> None:
    """Nodes that registered afresh with the restarted scheduler although the job had
    formed: the old scheduler died with their REGISTER_OK still unsent (it formed, told
    some nodes, and was killed).  They get the place the first formation gave them, the
    same rule as Scheduler.assign: a worker's rank from the hosts in DMLC_WORKER_ID order
    and its local rank, node ids after the servers' in rank order; a server the server
    id nobody took back.  Elastic or re-formed jobs (ranks moved since) cannot be rebuilt:
    the job ends naming the node, instead of it waiting for a book that never comes."""
    fresh = [i for i, n in {**s.servers, **s.workers}.items() if "node_id" not in n]
    if not fresh:
        return
    hosts = sorted(s.hosts.values(), key=lambda h: h["worker_id"])
    if s.elastic is not None or s.epoch != 1 or any(h["worker_id"] < 0 for h in hosts):
        n = s.servers.get(fresh[0]) or s.workers[fresh[0]]
        return s.fail(f"{describe(n)} registered as new with a restarted scheduler after the "
                      f"job had formed (epoch {s.epoch}): its place cannot be rebuilt "
                      f"(elastic, re-formed, or no DMLC_WORKER_ID); restart the job")
    free = sorted(set(range(1, s.cfg.num_server + 1))
                  - {n["node_id"] for n in s.servers.values() if "node_id" in n})
    base, at = {}, 0
    for h in hosts:
        base[h["worker_id"]], at = at, at + h["local_size"]
    for i in fresh:
        n = s.servers.get(i)
        if n is not None:
            n["node_id"], n["rank"] = free.pop(0), -1
        else:
            n = s.workers[i]
            n["rank"] = base[s.hosts[n["host_id"]]["worker_id"]] + n["local_rank"]
            n["node_id"] = s.cfg.num_server + 1 + n["rank"]
        log.warning("restarted scheduler: %s registered as new (its address book was lost "
                    "with the old scheduler); it gets its place back", describe(n))
    s.send_books(fresh)

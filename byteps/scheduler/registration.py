"""What a node's REGISTER message says about it, validated (the scheduler's node record)."""
from __future__ import annotations

import time

from byteps.transport.wire import WireError


def node_info(b: dict, seq: int) -> dict:
    """The scheduler's record of a node from its REGISTER body ``b`` (``role`` already
    checked), with ``seq`` (the message's) and ``last_seen`` (now); WireError when a field
    is malformed."""
    role = b.get("role")
    info = {k: b.get(k) for k in ("role", "host", "host_id", "pid", "hostname", "machine",
                                  "address",
                                  "local_rank", "local_size", "worker_id")}
    if not all(isinstance(info[k], int) for k in ("pid", "local_rank", "local_size",
                                                   "worker_id")):
        raise WireError("registration fields pid/local_rank/local_size/worker_id must be ints")
    info["local_reduce"] = b.get("local_reduce", "off")     # local reduction mode of a worker
    if info["local_reduce"] not in ("off", "slice", "root"):
        raise WireError("registration field local_reduce must be off, slice or root")
    info["tuning"] = b.get("tuning")     # [autotune, partition bytes, credit] (autotune.py)
    if info["tuning"] is not None and not (
            isinstance(info["tuning"], list) and len(info["tuning"]) == 3
            and all(type(x) is int for x in info["tuning"])):
        raise WireError("registration field tuning must be a list of 3 ints")
    if not all(isinstance(info[k], str) for k in ("host", "host_id", "hostname", "machine")):
        raise WireError("registration fields host/host_id/hostname must be strings")
    if role == "worker" and not (info["address"] is None or (
            isinstance(info["address"], str) and len(info["address"]) <= 300)):
        raise WireError("a worker's peer address must be a string "
                        "(byteps/core/algorithms/peers.py)")
    info["last_seen"] = time.monotonic()
    info["seq"] = seq
    if role == "server" and not isinstance(info["address"], str):
        raise WireError("server registration needs an address")
    return info


def missing(s, waited: float) -> str:
    """What the scheduler still waits for at its start-up timeout."""
    parts = []
    if len(s.servers) < s.cfg.num_server:
        parts.append(f"{len(s.servers)} of {s.cfg.num_server} servers registered "
                     f"after {waited:.0f} s: expected DMLC_NUM_SERVER={s.cfg.num_server}")
    if len(s.hosts) < s.cfg.num_worker:
        parts.append(f"{len(s.hosts)} of {s.cfg.num_worker} worker hosts registered "
                     f"after {waited:.0f} s: expected DMLC_NUM_WORKER={s.cfg.num_worker}")
    for hid, h in s.hosts.items():
        if len(h["slots"]) < h["local_size"]:
            parts.append(f"host {hid}: {len(h['slots'])} of {h['local_size']} local workers "
                         f"registered (BYTEPS_LOCAL_SIZE={h['local_size']})")
    return "; ".join(parts) or "start-up timed out"


def replay_key(s, ident: bytes, hdr) -> tuple:
    """What makes a REGISTER a replay of one already handled.  After formation: the same
    node and message sequence number (a worker that re-initialises registers again with a
    new one).  Before formation: the same node over the same connection identity, whatever
    the sequence number: a node whose connection to a restarted scheduler comes back sends
    its registration again, and the one it had sent while no scheduler ran (ZeroMQ queued
    it) arrives too; the second must not be refused as a second server at that address
    (or a local rank registered twice), which ended the job."""
    b = hdr.body
    return (b.get("role"), b.get("host_id"), b.get("pid"), hdr.seq if s.formed else ident)

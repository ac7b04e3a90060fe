"""Workers that call shutdown() and init() again: the group re-forms, or they hear why not.

A fixed-size job re-forms when every worker has registered again (a new epoch, the same
ranks).  A worker whose process ended (EXIT) can never register again, so a re-registration
while one has exited (or pending when one exits) is refused at once, naming that worker,
instead of waiting BYTEPS_STARTUP_TIMEOUT for it.  (Elastic jobs: membership.py.)
"""
from __future__ import annotations

import logging
import time

from byteps.common.node import describe

log = logging.getLogger("byteps.scheduler")


def blocked(s) -> str | None:
    """Why the workers cannot re-form any more (a worker's process ended), or None."""
    ended = [w for i, w in s.workers.items() if i in s.exited]
    if not ended:
        return None
    names = ", ".join(describe(dict(w, role="worker")) for w in ended[:4])
    return (f"the job cannot re-form: {names} exited (its process ended), and a job "
            f"re-forms only when every worker calls shutdown() and then init() again; start "
            f"a new job (scheduler, servers and every worker) instead")


def register_again(s, ident: bytes, info: dict) -> None:
    """A worker re-initialises after shutdown(): re-form when every worker has."""
    old = next((k for k, w in s.workers.items() if w["host_id"] == info["host_id"]
                and w["local_rank"] == info["local_rank"]), None)
    if old is not None and old not in s.left and old not in s.exited:
        # the LEAVE of the old connection may still be on its way (another TCP stream)
        s.early_rejoin[old] = (ident, info)
        return
    if old is None or old not in s.left:
        return s.refuse(ident, f"worker at host {info['host_id']} local rank "
                        f"{info['local_rank']} is not part of this job, or has not left "
                        f"it (call shutdown() before init() again)")
    why = blocked(s)
    if why is not None:
        return s.refuse(ident, why)
    s.rejoin[old] = dict(info, new_ident=ident)
    s.rejoin_since = s.rejoin_since or time.monotonic()
    if len(s.rejoin) == len(s.workers):
        for old_ident, new in s.rejoin.items():
            w = s.workers.pop(old_ident)
            new_ident = new.pop("new_ident")
            new.update(rank=w["rank"], node_id=w["node_id"], last_seen=time.monotonic())
            s.workers[new_ident] = new
        s.rejoin.clear()
        s.left.clear()
        s.departures.clear()
        s.rejoin_since = None
        s.epoch += 1
        log.info("workers re-formed the job: epoch %d", s.epoch)
        s.send_books(list(s.servers) + list(s.workers))


def on_exit(s) -> None:
    """A worker's process ended: refuse the re-registrations that wait for it."""
    why = blocked(s) if s.rejoin else None
    if why is None:
        return
    for new in s.rejoin.values():
        s.refuse(new["new_ident"], why)
    s.rejoin.clear()
    s.rejoin_since = None

"""LOST: a cluster bpslaunch tells the scheduler that a process it started died.

On one machine (``bpslaunch --standalone``) the scheduler reads the pids of dead workers
from bpslaunch's status folder (membership.py LOST_FILE).  On a cluster every host's
bpslaunch (role mode) sends ``Op.LOST`` to the scheduler instead, authenticated with
the job secret like every message: ``{"role", "host_id", "pid", "what", "how"}``.

Before the job formed, a worker that died cannot register any more:

* a fixed-size job cannot form without it: the job ends at once, naming it ("worker
  (DMLC_WORKER_ID=2, host h3, local rank 0) (pid 42) was killed by SIGKILL before the
  job formed"), instead of after BYTEPS_STARTUP_TIMEOUT with "1 of 2 local workers
  registered";
* an elastic job forms without it once the others registered (membership.py
  ``before_formation``), as on one machine.

After formation the report is only logged: a member's death is seen by its connection
and its heartbeats, and handled as always (a failure, or an elastic re-form).
"""
from __future__ import annotations

import logging

from byteps.transport.wire import WireError

log = logging.getLogger("byteps.scheduler")

_TEXT = {"host_id": 256, "what": 300, "how": 200}


def check(body) -> dict:
    """The fields of a LOST body, each validated (raises WireError)."""
    if not isinstance(body, dict):
        raise WireError("LOST body must be a map")
    if body.get("role") not in ("worker", "server"):
        raise WireError(f"LOST: bad role {body.get('role')!r}")
    pid = body.get("pid")
    if type(pid) is not int or not 0 < pid < 2 ** 31:
        raise WireError(f"LOST: field 'pid' must be a positive integer, got {pid!r}")
    out = {"role": body["role"], "pid": pid}
    for name, limit in _TEXT.items():
        v = body.get(name)
        if not isinstance(v, str) or not v or len(v) > limit or not v.isprintable():
            raise WireError(f"LOST: field {name!r} must be printable text of at most "
                            f"{limit} characters")
        out[name] = v
    return out


def on_lost(s, body) -> None:
    """Handle a LOST report on the scheduler ``s``."""
    try:
        b = check(body)
    except WireError as exc:
        s.drops.warn("bad LOST report", str(exc))
        return
    why = f"{b['what']} (pid {b['pid']}) {b['how']}"
    if s.formed:
        log.info("bpslaunch reports: %s", why)
        return
    if s.elastic is not None and b["role"] == "worker":
        if s.elastic.note_lost(b["host_id"], b["pid"]):
            log.warning("elastic: %s before the job formed; it forms without it once "
                        "--min-workers registered (BYTEPS_MIN_WORKERS)", why)
        s.maybe_form()
        return
    s.fail(f"{why} before the job formed; it cannot form without it (DMLC_NUM_WORKER="
           f"{s.cfg.num_worker}, DMLC_NUM_SERVER={s.cfg.num_server}): see that host's log "
           f"for why it died", linger=True)
    # (the scheduler stays until every node was told, or the start-up timeout: this one
    # will never ask)
    s.told.add(f"lost/{b['host_id']}/{b['pid']}".encode())

"""``init()`` again after ``shutdown()``, when the job has already ended.

A job ends ``BYTEPS_REINIT_WAIT_S`` after all of its workers called ``shutdown()`` unless
one calls ``init()`` again within it; the scheduler, the servers and their ports are then
gone.  A registration to a scheduler that is gone got no answer and waited its whole
start-up timeout (``BYTEPS_STARTUP_TIMEOUT`` + 15 s, 75 s by default) before saying so.
This check makes that case fail within seconds: a process that was in the job before
waits for its new scheduler connection's handshake (the link's own socket monitor; no
other connection is made, so the scheduler's per-connection bookkeeping sees nothing
new); when none completes within :data:`PROBE_S` (nothing answers at the scheduler's
address any more), ``init()`` raises naming the cause and the fix.  With
``BPSLAUNCH_SCHEDULER_RESTART=1`` (bpslaunch restarts a scheduler that a signal killed,
``--standalone`` included) the wait is :data:`PROBE_RESTARTABLE_S`, the time a restarted
scheduler takes to listen again.  A connection that completes is left to the
registration's own checks.
"""
from __future__ import annotations

import os
import time

from byteps.common.errors import BytePSError

PROBE_S = 5.0
PROBE_RESTARTABLE_S = 10.0


def check_job_alive(cfg, last_link: dict | None, link) -> None:
    """Raise BytePSError when this process called ``shutdown()`` before (``last_link``)
    and ``link`` (its new, not yet registered SchedulerLink) gets no connection."""
    if last_link is None or getattr(link, "watch", None) is None:
        return
    restartable = os.environ.get("BPSLAUNCH_SCHEDULER_RESTART") == "1"
    limit = PROBE_RESTARTABLE_S if restartable else PROBE_S
    end = time.monotonic() + limit
    while time.monotonic() < end:
        # (consuming the first "up" is harmless: the link has never been down)
        if any(kind == "up" for kind, _, _ in link.watch.poll()):
            return
        time.sleep(0.05)
    raise BytePSError(
        f"worker: this process called shutdown() before and the job has ended (no "
        f"connection to the "
        f"scheduler at {cfg.root_uri}:{cfg.root_port} within {limit:g} s): a job ends "
        f"BYTEPS_REINIT_WAIT_S={cfg.reinit_wait_s:g} s after all of its workers called "
        f"shutdown() unless one calls init() again within that time; set "
        f"BYTEPS_REINIT_WAIT_S higher on every process (the scheduler's value counts) if "
        f"workers call init() again later than that, or start a new job")

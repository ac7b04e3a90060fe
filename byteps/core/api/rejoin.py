"""``init()`` again after ``shutdown()``, when the job has already ended.

A job ends ``BYTEPS_REINIT_WAIT_S`` after all of its workers called ``shutdown()`` unless
one calls ``init()`` again within it; the scheduler, the servers and their ports are then
gone.  A registration to a scheduler that is gone got no answer and waited its whole
start-up timeout (``BYTEPS_STARTUP_TIMEOUT`` + 15 s, 75 s by default) before saying so.
This check makes that case fail at once: before registering again, a process that was in
the job connects to the scheduler's TCP port; when the connection is refused for
:data:`PROBE_S` (nothing listens there any more), ``init()`` raises naming the cause and
the fix.  Anything else (the port answers, a timeout, a host that cannot be resolved) is
left to the registration's own checks.  With ``BPSLAUNCH_SCHEDULER_RESTART=1`` (bpslaunch
restarts a scheduler that a signal killed, ``--standalone`` included) the refusals must
last :data:`PROBE_RESTARTABLE_S`, the time a restarted scheduler takes to listen again.
"""
from __future__ import annotations

import os
import socket
import time

from byteps.common.errors import BytePSError

PROBE_S = 3.0
PROBE_RESTARTABLE_S = 10.0


def check_job_alive(cfg, last_link: dict | None) -> None:
    """Raise BytePSError when this process called ``shutdown()`` before (``last_link``)
    and nothing listens at the scheduler's address any more."""
    if last_link is None:
        return
    restartable = os.environ.get("BPSLAUNCH_SCHEDULER_RESTART") == "1"
    end = time.monotonic() + (PROBE_RESTARTABLE_S if restartable else PROBE_S)
    while True:
        try:
            with socket.create_connection((cfg.root_uri, cfg.root_port), timeout=1.0):
                return
        except ConnectionRefusedError:
            if time.monotonic() >= end:
                break
            time.sleep(0.1)
        except OSError:
            return
    raise BytePSError(
        f"worker: init() after shutdown(): the job has ended (nothing listens at the "
        f"scheduler's address {cfg.root_uri}:{cfg.root_port} any more): a job ends "
        f"BYTEPS_REINIT_WAIT_S={cfg.reinit_wait_s:g} s after all of its workers called "
        f"shutdown() unless one calls init() again within that time; set "
        f"BYTEPS_REINIT_WAIT_S higher on every process (the scheduler's value counts) if "
        f"workers call init() again later than that, or start a new job")

"""``DMLC_ROLE=scheduler bpslaunch --restart-scheduler``: a cluster's scheduler that survives.

In role mode bpslaunch normally *becomes* the role (``exec``).  With
``--restart-scheduler`` the scheduler's bpslaunch stays its parent instead and, when
the scheduler dies of a signal (SIGKILL, the OOM killer), starts a new one on the same
``DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT``, at most ``supervise.MAX_SCHEDULER_RESTARTS``
times.  The servers' and workers' bpslaunch, given the same flag, tell their processes
to wait for it (``BPSLAUNCH_SCHEDULER_RESTART=1``, byteps/common/node.py) and register
again with their ids, ranks and epoch (byteps/scheduler/resume.py): training goes on.
A scheduler that exits by itself (the job ended, or it ended the job) is not restarted:
bpslaunch exits with its code.  ``bpslaunch --standalone`` and ``-H`` do this by default.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time

RESTART_ENV = "BPSLAUNCH_SCHEDULER_RESTART"


def run_scheduler(env: dict) -> int:
    """Run the scheduler (role mode) and start it again when a signal kills it."""
    from byteps.launcher.supervise import Job, describe_code, say
    status = tempfile.mkdtemp(prefix="bpslaunch-status-")
    job = Job(status_dir=status, in_cluster=True)
    job.restart_scheduler = True
    job.workers = []                # (SIGINT: no worker to forward it to)
    job.scheduler = job.start("scheduler", [sys.executable, "-m", "byteps.scheduler"],
                              dict(env))
    try:
        while True:
            if job.interrupted is not None:         # SIGINT/SIGTERM to this bpslaunch
                job.terminate()
                return 128 + (job.signalled or signal.SIGINT)
            job._maybe_restart_scheduler([job.scheduler], [])
            code = job.scheduler.p.poll()
            if code is not None:                    # ended by itself, or out of restarts
                if code < 0:
                    say(f"the scheduler (pid {job.scheduler.p.pid}) died with "
                        f"{describe_code(code)} after {job.scheduler_restarts} restart(s); "
                        f"the job cannot continue")
                job.terminate(grace=1.0)
                return code if code >= 0 else 128 - code
            time.sleep(0.05)
    finally:
        shutil.rmtree(status, ignore_errors=True)


def wait_for_restarts() -> None:
    """Servers and workers of this bpslaunch wait for a restarted scheduler."""
    os.environ[RESTART_ENV] = "1"

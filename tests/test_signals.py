"""Issue 14, part 2: SIGINT to bpslaunch reaches the workers as KeyboardInterrupt first,
then SIGTERM after --grace-period, then SIGKILL; nothing is left running or in /dev/shm."""
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BPSLAUNCH, ROOT, SCRIPTS, job_env

pytestmark = pytest.mark.timeout(120)


def _job_pids(job: str) -> list[int]:
    tag = f"BYTEPS_JOB_ID={job}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in env.split(b"\0") and state != "Z":
            found.append(int(d))
    return found


def _start(tmp_path, workers, *args, launcher=()):
    job = f"sigint-{secrets.token_hex(4)}"
    cmd = BPSLAUNCH + ["--standalone", "--num-workers", str(workers), "--num-servers", "2",
                       *launcher, sys.executable, str(SCRIPTS / "sigint_worker.py"),
                       str(tmp_path), *args]
    p = subprocess.Popen(cmd, env=job_env(BYTEPS_JOB_ID=job, BYTEPS_ENABLE_IPC=1), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready.rank*"))) < workers:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    return p, job


def _finish(p, job):
    try:
        out, err = p.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"bpslaunch did not end after SIGINT:\n{err[-3000:]}")
    deadline = time.monotonic() + 3
    while _job_pids(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _job_pids(job) == [], f"processes of the job left: {_job_pids(job)}"
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"bps-{job}")] == []
    return out, err


def test_sigint_reaches_every_worker_as_keyboard_interrupt(tmp_path):
    p, job = _start(tmp_path, 3)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = _finish(p, job)
    took = time.monotonic() - t0
    assert sorted(x.name for x in tmp_path.glob("interrupted.rank*")) == \
        ["interrupted.rank0", "interrupted.rank1", "interrupted.rank2"], err[-3000:]
    assert p.returncode == 130, err[-3000:]
    assert "received SIGINT; sent SIGINT to 3 worker(s)" in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "job interrupted (SIGINT): 3 of 3 worker(s) ended within the grace period" in last, \
        last
    assert took < 10, took


def test_sigterm_after_grace_period_for_a_worker_that_ignores_sigint(tmp_path):
    p, job = _start(tmp_path, 2, "stubborn", launcher=("--grace-period", "2"))
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = _finish(p, job)
    took = time.monotonic() - t0
    assert (tmp_path / "interrupted.rank1").exists() and (tmp_path / "interrupted.rank0").exists()
    assert "still running after the 2 s grace period: SIGTERM" in err, err[-3000:]
    assert 2 <= took < 9, took
    assert p.returncode == 130

"""The chaos harness's CI form: 20 seeded faults on small jobs (benchmarks/chaos.py).

Every run must survive with the right parameters or end with an error that names the
fault: no hang, no silent wrong result, no process or /dev/shm file left behind.  The
long form (``pytest -m chaos_full tests/test_chaos.py``, or ``benchmarks/chaos.py
--faults 300``) draws every fault kind, with freezes up to 30 s."""
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos

pytestmark = pytest.mark.timeout(240)


def _check(out):
    import json
    runs = json.loads((out / "chaos.json").read_text())["runs"]
    for r in runs:
        assert r["outcome"] in ("survived", "right error"), r
        assert not r["leftover_pids"] and not r["leftover_shm"], r
    return runs


@pytest.mark.chaos_full     # the 20 below draw these kinds too
def test_seeded_faults_end_correctly(tmp_path):
    # 2 faults of the plain shape (CI time): a scheduler killed (restarted) and a worker
    # killed or raising mid-step
    rc = chaos.main(["--faults", "2", "--seed", "4", "--shapes", "plain", "--kinds",
                     "kill-scheduler,kill-worker,raise", "--out", str(tmp_path)])
    runs = _check(tmp_path)
    assert rc == 0, runs


def test_twenty_seeded_faults_of_every_kind(tmp_path):
    # CI's form (about 65 s): every kind, both shapes, freezes up to 12 s
    rc = chaos.main(["--faults", "20", "--seed", "1", "--max-freeze", "12",
                     "--out", str(tmp_path)])
    _check(tmp_path)
    assert rc == 0


@pytest.mark.chaos_full
def test_a_worker_frozen_past_the_heartbeat_timeout_is_fenced_out(tmp_path):
    """An elastic job's worker frozen (SIGSTOP) for twice the heartbeat timeout: the group
    re-forms without it; when it resumes it is told that it was removed and ends; the
    others' parameters equal a one-process run's."""
    import json
    import os
    import signal
    import subprocess
    import time

    import numpy as np
    from chaos_job import reference
    from conftest import BPSLAUNCH, job_env
    job = f"freeze-{os.getpid()}-{int(time.time())}"
    cmd = BPSLAUNCH + ["--standalone", "-np", "3", "--num-servers", "1", "--min-workers", "2",
                       sys.executable, str(ROOT / "benchmarks" / "chaos_job.py"),
                       str(tmp_path), "400"]
    p = subprocess.Popen(cmd, env=job_env(BYTEPS_JOB_ID=job, BYTEPS_HEARTBEAT_INTERVAL=0.3,
                                          BYTEPS_HEARTBEAT_TIMEOUT=3), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(chaos.job_pids(job, "worker")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)
        victim = chaos.job_pids(job, "worker")[-1]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(6)
        os.kill(victim, signal.SIGCONT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    assert "this worker was removed from the job" in err, err[-3000:]
    ref = reference(400)
    for f in sorted(tmp_path.glob("rank*.json")):
        d = json.loads(f.read_text())
        assert d["size"] == 2
        np.testing.assert_allclose(np.array(d["w"], np.float32), ref, rtol=1e-4, atol=1e-5)

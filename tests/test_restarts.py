"""Issue 14, part 3: bpslaunch --max-restarts restarts the whole job after a failure; the
script resumes from its own checkpoint and ends with the parameters of an undisturbed run."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import BPSLAUNCH, SCRIPTS, assert_ok, job_env, read_results, run_job

pytestmark = pytest.mark.timeout(180)


def _reference(steps: int, n: int) -> np.ndarray:
    w = np.zeros(1000, np.float32)
    for s in range(steps):
        total = np.zeros(1000, np.float32)
        for r in range(n):
            total += (((np.arange(1000) * (r + 1) + 3 * s) % 17) - 8).astype(np.float32) / 4
        w -= np.float32(0.5) * np.divide(total, np.float32(n))
    return w


def test_crash_once_restarts_and_completes(tmp_path):
    res = run_job([sys.executable, str(SCRIPTS / "restart_worker.py"), str(tmp_path), "50", "30"],
                  workers=2, servers=1, timeout=150, launcher_args=("--max-restarts", "2"),
                  BYTEPS_ENABLE_IPC=0, BYTEPS_LOG_LEVEL="INFO")
    assert_ok(res)
    # the same job formed again in a new range of membership epochs
    assert "epoch 1\n" in res.stderr and "epoch 65537\n" in res.stderr, res.stderr[-3000:]
    assert (tmp_path / "crashed").exists()
    assert "restart 1 of 2 (--max-restarts)" in res.stderr, res.stderr[-3000:]
    assert "simulated crash at step 30" in res.stderr
    assert res.stderr.strip().splitlines()[-1] == "bpslaunch: job finished after 1 restart(s)"
    out = read_results(tmp_path)
    ref = _reference(50, 2)
    for r in (0, 1):
        assert out[r]["restart"] == 1 and out[r]["start"] == 30, out[r]["start"]
        assert np.array_equal(np.array(out[r]["w"], np.float32), ref)


def test_restarts_are_bounded(tmp_path):
    # a job that fails every time: one restart, then bpslaunch gives up with the exit code
    res = run_job([sys.executable, "-c", "import byteps.numpy as b; b.init(); raise SystemExit(3)"],
                  workers=2, servers=1, timeout=120, launcher_args=("--max-restarts", "1"),
                  BYTEPS_ENABLE_IPC=0)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "restart 1 of 1" in res.stderr and "restart 2" not in res.stderr
    assert "job failed after 1 restart(s) (--max-restarts 1)" in res.stderr


def test_max_restarts_needs_standalone():
    r = subprocess.run(BPSLAUNCH + ["--max-restarts", "1", "--local-size", "1", "true"],
                       env=job_env(DMLC_ROLE="worker"), capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2 and "--max-restarts restarts a --standalone job" in r.stderr

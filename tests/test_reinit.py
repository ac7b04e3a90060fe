"""init()/shutdown() cycles: re-forming the group is fast, and so is ending the job.

Two patterns: workers of one job that call shutdown() and init() again (the group
re-forms with a new epoch), and the original BytePS's meta_test.py, which starts a new
scheduler and server around every test and waits for them to exit after shutdown().
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SCRIPTS, assert_ok, job_env, read_results, run_job, run_script

from byteps.launcher import free_port


@pytest.mark.timeout(60)
@pytest.mark.parametrize("local", [1, 2], ids=["2 hosts", "1 host x 2 local"])
def test_five_reinit_cycles_of_a_two_worker_job(tmp_path, local):
    t0 = time.monotonic()
    res = run_script("reinit_cycles.py", tmp_path, 5, workers=2, servers=1, timeout=40,
                     launcher_args=("--hosts", str(2 // local), "--local-size", str(local)),
                     BYTEPS_STARTUP_TIMEOUT=20)
    total = time.monotonic() - t0
    assert_ok(res)
    out = read_results(tmp_path)
    for r, doc in out.items():
        assert doc["failures"] == [], doc
        assert max(doc["inits"][1:]) < 0.5, f"rank {r}: re-init took {doc['inits']}"
    assert total < 15, f"5 cycles took {total:.1f} s"
    assert "dropped HELLO" not in res.stderr, res.stderr[-2000:]


@pytest.mark.timeout(120)
def test_meta_test_pattern_scheduler_and_server_exit_after_shutdown(tmp_path):
    """The original's tests: after shutdown() the scheduler and the server end within
    BYTEPS_REINIT_WAIT_S (2 s), not after BYTEPS_STARTUP_TIMEOUT (60 s)."""
    out = tmp_path / "cycles.json"
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, str(SCRIPTS / "reinit_meta.py"), str(out), "5",
                              str(free_port())], env=job_env(), cwd=ROOT, capture_output=True,
                             text=True, timeout=100, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out: {exc.stderr}")
    total = time.monotonic() - t0
    assert_ok(res)
    cycles = json.loads(out.read_text())
    assert len(cycles) == 5 and all(c["codes"] == [0, 0] for c in cycles), cycles
    for c in cycles:
        assert c["exit_wait_s"] < 4.5, cycles        # 2 s wait + exit, not 60 s
        assert c["init_s"] < 10, cycles
    assert total < 60, f"{total:.1f} s"


@pytest.mark.timeout(90)
def test_init_after_the_job_ended_says_why(tmp_path):
    """Every worker shut down and none came back within BYTEPS_REINIT_WAIT_S: the job
    ended, and a later init() says so instead of only 'scheduler unreachable'."""
    code = ("import time, byteps.numpy as bps\n"
            "bps.init(); bps.shutdown(); time.sleep(2)\n"
            "try:\n    bps.init()\nexcept bps.BytePSError as e:\n    print('ERR', e)\n")
    res = run_job([sys.executable, "-c", code], workers=1, servers=1, timeout=60,
                  BYTEPS_REINIT_WAIT_S=0.3, BYTEPS_STARTUP_TIMEOUT=1)
    assert_ok(res)
    assert "ERR" in res.stdout and "called shutdown() before" in res.stdout, res.stdout
    assert "BYTEPS_REINIT_WAIT_S=0.3 s" in res.stdout

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


@pytest.mark.timeout(60)
def test_init_after_the_job_ended_says_why_within_seconds(tmp_path):
    """Every worker shut down and none came back within BYTEPS_REINIT_WAIT_S: the job
    ended and its scheduler exited.  A later init() says so after a few seconds of refused
    connections, not after the start-up timeout (60 s here), and names the fix."""
    code = ("import time, byteps.numpy as bps\n"
            "bps.init(); bps.shutdown(); time.sleep(2)\n"
            "t = time.monotonic()\n"
            "try:\n    bps.init()\nexcept bps.BytePSError as e:\n"
            "    print('ERR', round(time.monotonic() - t, 2), e)\n")
    res = run_job([sys.executable, "-c", code], workers=1, servers=1, timeout=40,
                  BYTEPS_REINIT_WAIT_S=0.3, BYTEPS_STARTUP_TIMEOUT=60)
    assert_ok(res)
    line = next((x.split("] ", 1)[-1] for x in res.stdout.splitlines() if "ERR" in x), None)
    assert line is not None, res.stdout + res.stderr[-2000:]
    assert float(line.split()[1]) < 16, line
    assert "called shutdown() before" in line and "BYTEPS_REINIT_WAIT_S=0.3 s" in line, line
    assert "connection refused" in line and "start a new scheduler" in line, line


REJOIN_AFTER_EXIT = """
import sys, time, numpy as np, byteps.numpy as bps
bps.init()
r = bps.rank()
bps.push_pull(np.ones(4, np.float32), name="x")
first = sys.argv[1]              # "reinit": rank 0 registers again before rank 1 exits
if r == 1:
    bps.shutdown()
    time.sleep(2 if first == "reinit" else 0)
    sys.exit(0)                  # this worker is done: its process ends
time.sleep(0 if first == "reinit" else 2)
bps.shutdown()
t = time.monotonic()
try:
    bps.init()
    print("NO ERROR")
except bps.BytePSError as e:
    print("ERR", round(time.monotonic() - t, 2), e)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("first", ["reinit", "exit"])
def test_reinit_after_another_worker_exited_is_refused_at_once(tmp_path, first):
    """Rank 1 finished (its process ended); rank 0 calls shutdown() and init() again.  The
    group can never re-form, and the scheduler says so at once, naming rank 1, whether the
    re-registration comes before or after rank 1's exit is known (not after the 60 s
    start-up timeout with 're-initialisation: 1 of 2 workers called init() again')."""
    res = run_job([sys.executable, "-c", REJOIN_AFTER_EXIT, first], workers=2, servers=1,
                  timeout=40, BYTEPS_STARTUP_TIMEOUT=60, BYTEPS_REINIT_WAIT_S=5)
    assert_ok(res)
    line = next((x.split("] ", 1)[-1] for x in res.stdout.splitlines() if "ERR" in x), "")
    assert line.startswith("ERR"), res.stdout + res.stderr[-2000:]
    assert float(line.split()[1]) < 5, line
    assert "cannot re-form" in line and "rank 1" in line and "exited" in line, line

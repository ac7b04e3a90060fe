"""bpslaunch --max-restarts restarts the whole job after a failure; the script resumes from
its own checkpoint and ends with the parameters of an undisturbed run.  A standalone job's
scheduler killed by a signal is restarted alone, and the job goes on."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import BPSLAUNCH, ROOT, SCRIPTS, assert_ok, job_env, read_results, run_job

sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos import job_pids
from chaos_job import reference

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


# --- a restartable scheduler ----------------------------------------------------------------
# bpslaunch --standalone starts a new scheduler on the same address when the scheduler dies
# of a signal; the servers and workers reconnect and register again with their node ids,
# ranks and epoch (byteps/scheduler/resume.py), and training never stops (pushes go to the
# servers directly).  The parameters equal a one-process run's.

RESTART_STEPS = 200


def _kill_the_scheduler_three_times(p: subprocess.Popen, job: str, spare=()) -> list[int]:
    """SIGKILL the job's scheduler three times, each time once it (or its successor) runs
    and both workers train (``spare``: pids not to kill, the scheduler's bpslaunch)."""
    killed = []
    deadline = time.monotonic() + 90
    while len(killed) < 3 and p.poll() is None and time.monotonic() < deadline:
        sched = [x for x in job_pids(job, "scheduler") if x not in killed and x not in spare]
        if sched and len(job_pids(job, "worker")) >= 2:     # (role mode: + bpslaunch)
            time.sleep(0.7)             # formed (or re-formed) and training
            os.kill(sched[0], signal.SIGKILL)
            killed.append(sched[0])
        time.sleep(0.05)
    return killed


def _check_parameters(out) -> None:
    ref = reference(RESTART_STEPS)
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for g in got:
        assert g["size"] == 2
        np.testing.assert_allclose(np.array(g["w"], np.float32), ref, rtol=1e-4, atol=1e-5)
    assert got[0]["w"] == got[1]["w"]


@pytest.mark.parametrize("layout", ["standalone", "-H"])
def test_scheduler_killed_three_times_does_not_end_the_job(tmp_path, layout):
    # standalone: two emulated hosts; -H localhost:2: the bootstrap of bpslaunch -H
    # (launcher/_remote.py) without ssh, which starts the new scheduler on the announced
    # address (ssh.RemoteProc.respawn)
    job = f"resched-{os.getpid()}-{int(time.time())}"
    how = ["--standalone", "-np", "2", "--hosts", "2", "--num-servers", "1"] \
        if layout == "standalone" else ["-H", "localhost:2"]
    cmd = BPSLAUNCH + how + [sys.executable, str(ROOT / "benchmarks" / "chaos_job.py"),
                             str(tmp_path), str(RESTART_STEPS)]
    p = subprocess.Popen(cmd, env=job_env(BYTEPS_JOB_ID=job, BYTEPS_HEARTBEAT_INTERVAL=0.5),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        killed = _kill_the_scheduler_three_times(p, job)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert len(killed) == 3, err[-3000:]
    assert p.returncode == 0, err[-4000:]
    assert err.count("started a new one") == 3, err[-3000:]
    _check_parameters(tmp_path)


def test_role_mode_restart_scheduler(tmp_path):
    """Cluster role mode: every role's bpslaunch with --restart-scheduler; the scheduler's
    bpslaunch starts a new scheduler on DMLC_PS_ROOT_URI:PORT (launcher/reschedule.py)."""
    from byteps.launcher import free_port
    job = f"resched-role-{os.getpid()}-{int(time.time())}"
    env = job_env(BYTEPS_JOB_ID=job, BYTEPS_HEARTBEAT_INTERVAL=0.5, DMLC_NUM_WORKER=2,
                  DMLC_NUM_SERVER=1, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                  BYTEPS_JOB_SECRET="chaos-" + "ab" * 16)
    work = [sys.executable, str(ROOT / "benchmarks" / "chaos_job.py"), str(tmp_path),
            str(RESTART_STEPS)]
    roles = [("scheduler", {}, []), ("server", {}, []),
             ("worker", {"DMLC_WORKER_ID": "0", "BYTEPS_EMULATED_HOST": "h0"}, work),
             ("worker", {"DMLC_WORKER_ID": "1", "BYTEPS_EMULATED_HOST": "h1"}, work)]
    procs = [subprocess.Popen(BPSLAUNCH + ["--restart-scheduler", *cmd],
                              env=dict(env, DMLC_ROLE=role, **extra), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role, extra, cmd in roles]
    try:
        killed = _kill_the_scheduler_three_times(procs[2], job, spare=(procs[0].pid,))
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(killed) == 3, outs[0][-3000:]
    assert [p.returncode for p in procs] == [0] * 4, "\n---\n".join(o[-2000:] for o in outs)
    assert outs[0].count("started a new one") == 3, outs[0][-3000:]
    _check_parameters(tmp_path)


def test_a_child_is_forked_without_an_import_or_dlopen_before_exec():
    """bpslaunch starts children (a restarted scheduler too) from a process with threads;
    what runs between fork and exec (``preexec_fn``) must neither import nor load a
    library, which can wait forever on a lock another thread held at the fork. An audit
    hook makes any import, dlopen or dlsym in a forked child exit 99 before its exec."""
    code = (
        "import os, sys\n"
        "from byteps.launcher.supervise import Proc\n"
        "parent = os.getpid()\n"
        "def hook(event, args):\n"
        "    if os.getpid() != parent and event in ('import', 'ctypes.dlopen', "
        "'ctypes.dlsym'):\n"
        "        os._exit(99)\n"
        "sys.addaudithook(hook)\n"
        "p = Proc('child', [sys.executable, '-c', 'pass'], dict(os.environ), True, cpus=[0])\n"
        "print(p.p.wait())\n")
    out = subprocess.run([sys.executable, "-c", code], env=job_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0"], (out.stdout, out.stderr)

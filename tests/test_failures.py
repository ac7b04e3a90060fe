"""Issue 6, tests 1-5 and 9: dead nodes, launcher hygiene, stalls, refused registrations.

Each test starts a real job role by role (tests/scripts/fail_cluster.py) so it
holds every pid, kills one process, and checks that every other process ends
non-zero in time with a message naming the dead node, and that nothing of the
job (process or listening socket) is left.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from fail_cluster import Cluster  # noqa: E402

from conftest import ROOT, job_env, read_results  # noqa: E402

pytestmark = pytest.mark.timeout(150)
FOREVER = 100000


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(hold=(), **kw) -> Cluster:
        c = Cluster(tmp_path, **kw)
        made.append(c)
        return c.start(hold)
    yield make
    for c in made:
        c.close()


def assert_gone(c: Cluster) -> None:
    """No process and no listening socket of the job is left."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and (c.job_pids() or c.listening()):
        time.sleep(0.1)
    assert c.job_pids() == [], f"processes of the job left: {c.job_pids()}"
    assert c.listening() == {}, f"listening sockets left: {c.listening()}"


def assert_all_failed_in_time(c: Cluster, t_kill: float, names, limit: float = 10.0) -> None:
    rcs = c.wait(limit + 20, names)
    late = {n: round(c.exit_at[n] - t_kill, 1) for n in names
            if n not in c.exit_at or c.exit_at[n] - t_kill > limit}
    assert not late, f"not ended within {limit} s of the kill: {late}\n{c.logs()}"
    ok = {n: rc for n, rc in rcs.items() if rc == 0}
    assert not ok, f"exited with 0 after a node died: {ok}\n{c.logs()}"


def test_sigkill_worker_ends_every_process(cluster):
    # rank 2 stops calling BytePS at step 3 (the others then block in synchronize)
    c = cluster(workers=3, servers=2, args=(FOREVER, "idle:2:3"))
    c.wait_files("idle.rank2", 1)
    c.wait_files("pid.rank*", 3)
    # every port of the job listens on the configured address only, never 0.0.0.0
    assert set(c.listening().values()) == {"127.0.0.1"}, c.listening()
    victim = c.worker_pid(0)
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    t_kill = time.monotonic()
    others = [n for n in c.procs if n != "worker0"]
    assert_all_failed_in_time(c, t_kill, others)
    c.wait(10, ["worker0"])
    # the killed worker's bpslaunch reports the signal; every other process ended because
    # of it: exit code 86 (the uncaught BytePSError, the watchdog, servers, the scheduler)
    assert c.procs["worker0"].returncode == 128 + signal.SIGKILL
    assert {n: c.procs[n].returncode for n in others} == {n: 86 for n in others}, c.logs()
    for name in ("worker1", "worker2", "scheduler", "server0", "server1"):
        text = c.log(name)
        assert "worker rank 0" in text and f"pid {victim}" in text and "id0" in text, \
            f"{name} does not name the dead worker:\n{text[-3000:]}"
    # rank 1 was blocked in synchronize(); rank 2 never called BytePS again
    assert "BytePSError" in c.log("worker1")
    assert "interrupting it" in c.log("worker2"), c.log("worker2")[-3000:]
    assert_gone(c)


def test_sigkill_server_names_server_and_keys(cluster):
    c = cluster(workers=2, servers=2, args=(FOREVER,), FAIL_STEP_SLEEP=0.05)
    c.wait_files("ready.rank*", 2)
    victim = c.procs["server1"].pid
    address = f"127.0.0.1:{c.server_ports[1]}"
    os.kill(victim, signal.SIGKILL)
    t_kill = time.monotonic()
    others = [n for n in c.procs if n != "server1"]
    assert_all_failed_in_time(c, t_kill, others)
    out = read_results(c.dir)
    for r in (0, 1):
        err = out[r]["error"]
        assert err and f"pid {victim}" in err and "server" in err, err
        assert "held" in err and "layer1.w" in err and "key " in err, err
        assert address in err or "server 2" in err, err
    assert_gone(c)


def test_sigkill_scheduler_ends_workers_and_servers(cluster):
    c = cluster(workers=2, servers=1, args=(FOREVER,), FAIL_STEP_SLEEP=0.05)
    c.wait_files("ready.rank*", 2)
    os.kill(c.procs["scheduler"].pid, signal.SIGKILL)
    t_kill = time.monotonic()
    others = [n for n in c.procs if n != "scheduler"]
    assert_all_failed_in_time(c, t_kill, others)
    for name in others:
        assert "scheduler unreachable" in c.log(name), f"{name}:\n{c.log(name)[-3000:]}"
    assert_gone(c)


def test_sigkill_bpslaunch_takes_all_children(tmp_path):
    job = f"failjob-launch-{os.getpid()}-{int(time.time())}"
    env = job_env(BYTEPS_JOB_ID=job, BYTEPS_PARTITION_BYTES=4096, FAIL_STEP_SLEEP=0.05)
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--num-workers", "2",
           "--hosts", "2", "--num-servers", "2", sys.executable,
           str(ROOT / "tests/scripts/fail_train.py"), str(tmp_path), str(FOREVER)]
    launcher = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    c = Cluster(tmp_path)
    c.job = job
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready.rank*"))) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, "job did not start"
            time.sleep(0.1)
        children = [p for p in c.job_pids() if p != launcher.pid]
        assert len(children) >= 5, children      # scheduler, 2 servers, 2 workers
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and c.job_pids():
            time.sleep(0.05)
        assert c.job_pids() == [], f"children of bpslaunch left: {c.job_pids()}"
    finally:
        launcher.kill()
        c.close()


def test_sigstop_worker_warns_then_finishes(cluster):
    c = cluster(workers=2, servers=1, args=(30,), FAIL_STEP_SLEEP=0.1,
                BYTEPS_STALL_WARNING_S=1, BYTEPS_HEARTBEAT_TIMEOUT=20)
    c.wait_files("ready.rank*", 2)
    victim = c.worker_pid(1)
    os.kill(victim, signal.SIGSTOP)
    try:
        time.sleep(3.5)
    finally:
        os.kill(victim, signal.SIGCONT)
    rcs = c.wait(90)
    assert all(rc == 0 for rc in rcs.values()), f"{rcs}\n{c.logs()}"
    out = read_results(c.dir)
    assert out[0]["failures"] == [] and out[1]["failures"] == []
    assert out[0]["digest"] == out[1]["digest"]
    text = c.log("server0")
    assert "stall" in text and "missing worker rank 1" in text and "id1" in text, text[-3000:]
    assert any(f"tensor '{n}'" in text for n in ("layer0.w", "layer1.w", "bias")), text[-3000:]
    assert "stall reported by" in c.log("scheduler")
    assert_gone(c)


def test_stall_shutdown_names_missing_rank_and_tensor(cluster):
    # rank 1 stops calling BytePS and ignores SIGINT: its exit watchdog must end it (code 86:
    # ended because of a failure elsewhere)
    c = cluster(workers=2, servers=1, args=(FOREVER, "idle:1:3:ignore"),
                BYTEPS_STALL_WARNING_S=0.5, BYTEPS_STALL_SHUTDOWN_S=2)
    c.wait_files("idle.rank1", 1)
    t_idle = time.monotonic()
    rcs = c.wait(40)
    assert all(rc not in (0, None) for rc in rcs.values()), f"{rcs}\n{c.logs()}"
    assert max(c.exit_at.values()) - t_idle < 20, c.logs()
    out = read_results(c.dir)
    err = out[0]["error"]
    assert err and "BYTEPS_STALL_SHUTDOWN_S=2" in err and "missing worker rank 1" in err, err
    assert "layer" in err or "bias" in err, err
    assert "partition(s)" in c.log("server0"), c.log("server0")[-3000:]
    text = c.log("worker1")
    assert "exiting this worker process with code 86" in text, text[-3000:]
    # its bpslaunch ends with the root cause: not here, the job was ended by the scheduler
    last = text.strip().splitlines()[-1]
    assert last.startswith("bpslaunch: job failed; root cause: every process of this "
                           "bpslaunch ended because another machine failed"), last
    assert "BYTEPS_STALL_SHUTDOWN_S=2" in last, last
    assert c.procs["worker1"].returncode == 86 and c.procs["scheduler"].returncode == 1
    assert_gone(c)


@pytest.mark.parametrize("bad", ["num_worker", "job_id"])
def test_mismatched_node_is_refused_and_job_fails_fast(cluster, bad):
    worker_env = {1: {"DMLC_NUM_WORKER": 3} if bad == "num_worker"
                  else {"BYTEPS_JOB_ID": "someone-elses-job"}}
    t0 = time.monotonic()
    # worker 0 and the server start after the job has already failed: they must fail fast too
    c = cluster(workers=2, servers=1, args=(20,), worker_env=worker_env,
                hold=("worker0", "server0"))
    c.wait(30, ["worker1"])
    time.sleep(1)
    c.start_held()
    rcs = c.wait(40)
    took = max(c.exit_at.values()) - t0
    assert all(rc not in (0, None) for rc in rcs.values()), f"{rcs}\n{c.logs()}"
    assert took < 25, f"took {took:.1f} s\n{c.logs()}"
    text = c.log("worker1")
    assert "refused registration" in text, text[-3000:]
    if bad == "num_worker":
        assert "DMLC_NUM_WORKER=3" in text and "DMLC_NUM_WORKER=2" in text, text[-3000:]
    else:
        assert "someone-elses-job" in text and c.job in text, text[-3000:]
    assert "refused" in c.log("scheduler")
    for late in ("server0", "worker0"):
        assert "the job ended before it formed: a node was refused" in c.log(late), \
            c.log(late)[-3000:]
    assert_gone(c)


@pytest.mark.parametrize("victim", ["worker0", "scheduler"])
def test_frozen_node_is_found_by_heartbeats(cluster, victim):
    """SIGSTOP keeps TCP connections open: only the heartbeat timeout can tell."""
    c = cluster(workers=2, servers=1, args=(FOREVER,), FAIL_STEP_SLEEP=0.05,
                BYTEPS_HEARTBEAT_INTERVAL=0.3, BYTEPS_HEARTBEAT_TIMEOUT=3)
    c.wait_files("ready.rank*", 2)
    pid = c.worker_pid(0) if victim == "worker0" else c.procs["scheduler"].pid
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        others = [n for n in c.procs if n != victim]
        assert_all_failed_in_time(c, t_stop, others, limit=10)
    finally:
        os.kill(pid, signal.SIGKILL)
    want = "stopped sending heartbeats" if victim == "worker0" else "no heartbeat answer"
    for name in others:
        assert want in c.log(name), f"{name}:\n{c.log(name)[-3000:]}"
    if victim == "worker0":
        assert f"pid {pid}" in c.log("worker1")
    c.wait(10)
    assert_gone(c)

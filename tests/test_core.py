"""Real multi-process jobs (bpslaunch --standalone) for the core push_pull path."""
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_ok, job_env, read_results, run_script

SMALL = {"BYTEPS_PARTITION_BYTES": 4096}


@pytest.mark.parametrize("workers,servers", [(1, 1), (2, 1), (2, 2), (3, 2)])
def test_push_pull_exact_all_dtypes_and_sizes(tmp_path, workers, servers):
    res = run_script("core_pushpull.py", tmp_path, workers=workers, servers=servers,
                     timeout=90, **SMALL)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == list(range(workers))
    for r, o in out.items():
        assert o["failures"] == [], f"rank {r}: {o['failures'][:3]}"
    # every worker receives identical bytes
    assert all(o["digests"] == out[0]["digests"] for o in out.values())
    assert len(out[0]["digests"]) == 5 * 6 * 2


def test_ranks_declaring_in_different_orders(tmp_path):
    res = run_script("core_pushpull.py", tmp_path, "reverse", workers=3, servers=2,
                     timeout=90, **SMALL)
    assert_ok(res)
    out = read_results(tmp_path)
    assert all(o["failures"] == [] for o in out.values())
    assert all(o["digests"] == out[0]["digests"] for o in out.values())


def test_shape_mismatch_raises_on_every_worker(tmp_path):
    res = run_script("core_misc.py", "mismatch", tmp_path, workers=2, servers=2, timeout=60)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr
    for o in out.values():
        err = o["error"]
        assert err and "layer1.weight" in err, err
        assert "(10,)" in err and "(12,)" in err and "rank 0" in err and "rank 1" in err
        assert o["seconds"] < 10


def test_async_mode_applies_each_push(tmp_path):
    res = run_script("core_misc.py", "async", tmp_path, workers=2, servers=1, timeout=60,
                     BYTEPS_ENABLE_ASYNC=1)
    assert_ok(res)
    for o in read_results(tmp_path).values():
        assert o["value"] == [6.0] * 4      # 2 workers x 3 pushes of ones


def test_broadcast_from_nonzero_root_and_reinit(tmp_path):
    res = run_script("core_misc.py", "broadcast_reinit", tmp_path, workers=3, servers=2,
                     timeout=90)
    assert_ok(res)
    out = read_results(tmp_path)
    for r, o in out.items():
        assert o["bcast"] == [float(i * 3) for i in range(6)]
        assert o["rank_after"] == r
        assert o["sum_after"] == [6, 6, 6]


def test_priority_overtakes_queued_partitions(tmp_path):
    rec = tmp_path / "arrivals.txt"
    res = run_script("core_misc.py", "priority", tmp_path, workers=1, servers=1, timeout=60,
                     BYTEPS_SCHEDULING_CREDIT=1, BYTEPS_PARTITION_BYTES=4096,
                     BYTEPS_FUSION_BYTES=0, BYTEPS_TEST_RECORD=rec)
    assert_ok(res)
    names = [line.split()[1] for line in rec.read_text().splitlines()]
    assert sorted(names) == sorted([f"low{i}" for i in range(6)] + ["high"])
    # at most the one partition already in flight may precede the high-priority tensor
    assert names.index("high") <= 1, names


def test_malformed_frames_are_dropped_while_job_completes(tmp_path):
    res = run_script("core_misc.py", "garbage", tmp_path, workers=2, servers=2, timeout=90)
    assert_ok(res)
    out = read_results(tmp_path)
    assert all(o["ok"] for o in out.values())
    assert "dropped" in res.stderr


def test_killed_worker_ends_job_quickly(tmp_path):
    token = f"killtest-{os.getpid()}-{time.time()}"
    t0 = time.monotonic()
    res = run_script("core_misc.py", "kill", tmp_path, token, workers=3, servers=1,
                     timeout=60)
    took = time.monotonic() - t0
    assert res.returncode != 0
    assert "worker rank 1" in res.stderr and "SIGKILL" in res.stderr, res.stderr
    assert took < 20, took           # start-up plus < 10 s to notice and end
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
    assert left.strip() == "", f"processes left: {left}"


def test_stall_warning_names_missing_rank_and_host(tmp_path):
    res = run_script("core_misc.py", "stall", tmp_path, workers=2, servers=1, timeout=60,
                     BYTEPS_STALL_WARNING_S=1)
    assert_ok(res)
    assert "slow.tensor" in res.stderr and "missing worker rank 1" in res.stderr, res.stderr
    assert "host1" in res.stderr


def test_missing_dmlc_variable_gives_clear_message():
    env = job_env(DMLC_NUM_WORKER=2, DMLC_NUM_SERVER=1, DMLC_PS_ROOT_PORT=9000)
    p = subprocess.run([sys.executable, "-c", "import byteps.numpy as bps; bps.init()"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode != 0
    assert "DMLC_PS_ROOT_URI is not set" in p.stderr and "example: DMLC_PS_ROOT_URI=" in p.stderr


def test_scheduler_startup_timeout_says_what_is_missing():
    env = job_env(DMLC_ROLE="scheduler", DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=2,
                  DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=0, BYTEPS_STARTUP_TIMEOUT=1.5,
                  BYTEPS_AUTH_DISABLE=1)
    from byteps.launcher import free_port
    env["DMLC_PS_ROOT_PORT"] = str(free_port())
    sched = subprocess.Popen([sys.executable, "-m", "byteps.launcher"], env=env, cwd=ROOT,
                             stderr=subprocess.PIPE, text=True)
    srv = subprocess.Popen([sys.executable, "-m", "byteps.launcher"], env=dict(env, DMLC_ROLE="server"),
                           cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        _, err = sched.communicate(timeout=30)
        _, serr = srv.communicate(timeout=30)
    finally:
        sched.kill()
        srv.kill()
    assert sched.returncode != 0
    assert "1 of 2 servers registered after" in err and "expected DMLC_NUM_SERVER=2" in err, err
    assert srv.returncode != 0 and "DMLC_NUM_SERVER=2" in serr, serr


def test_scalars_and_non_contiguous_arrays(tmp_path):
    import numpy as np
    res = run_script("core_misc.py", "scalar", tmp_path, workers=2, servers=1, timeout=60)
    assert_ok(res)
    for o in read_results(tmp_path).values():
        assert o["scalar"] == [[], 3.0] and o["inplace"] == [[], 1.0]
        assert o["transposed"] == (np.arange(12).reshape(3, 4).T * 3).tolist()


def test_original_style_import_starts_scheduler_and_server(tmp_path):
    """DMLC_ROLE=server|scheduler python3 -c 'import byteps.server', as the original."""
    from byteps.launcher import free_port
    port = free_port()
    env = job_env(DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT=port, BYTEPS_JOB_SECRET="s", BYTEPS_JOB_ID="orig")
    procs = [subprocess.Popen([sys.executable, "-c", "import byteps.server"], cwd=ROOT,
                              env=dict(env, DMLC_ROLE=role)) for role in ("scheduler", "server")]
    try:
        w = subprocess.run([sys.executable, "-c",
                            "import numpy as np, byteps.numpy as bps; bps.init(); "
                            "print(bps.push_pull(np.arange(3.0), name='x').tolist())"],
                           env=dict(env, DMLC_ROLE="worker", DMLC_WORKER_ID="0"), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert w.returncode == 0, w.stderr
        assert w.stdout.strip() == "[0.0, 1.0, 2.0]"
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()


def test_cluster_workers_without_worker_id_on_one_machine():
    """Two `DMLC_ROLE=worker bpslaunch` hosts without DMLC_WORKER_ID, as on a cluster."""
    from byteps.launcher import free_port
    env = job_env(DMLC_NUM_WORKER=2, DMLC_NUM_SERVER=1, DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT=free_port(), BYTEPS_JOB_SECRET="s", BYTEPS_JOB_ID="noid")
    launch = [sys.executable, "-m", "byteps.launcher"]
    procs = [subprocess.Popen(launch, cwd=ROOT, env=dict(env, DMLC_ROLE=role))
             for role in ("scheduler", "server")]
    code = ("import numpy as np, byteps.numpy as bps; bps.init(); "
            "print(bps.size(), bps.push_pull(np.ones(3), name='x', average=False).tolist())")
    workers = [subprocess.Popen(launch + [sys.executable, "-c", code], cwd=ROOT,
                                env=dict(env, DMLC_ROLE="worker"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outs = [w.communicate(timeout=60) for w in workers]
        assert [w.returncode for w in workers] == [0, 0], outs
        assert all(o.strip() == "2 [2.0, 2.0, 2.0]" for o, _ in outs), outs
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
    finally:
        for p in procs + workers:
            p.kill()

"""Local reduction among the workers of a (possibly emulated) host: real multi-process jobs."""
from __future__ import annotations

import json
import os
import secrets
import time

import pytest
from conftest import assert_ok, read_results, run_script

from byteps.core.local.shm import host_prefix, job_prefix

pytestmark = pytest.mark.timeout(600)
SMALL = {"BYTEPS_PARTITION_BYTES": 4096}


def _run(tmp_path, hosts, local, servers=1, **env):
    res = run_script("local_pushpull.py", tmp_path, 2, workers=hosts * local, servers=servers,
                     timeout=240, launcher_args=("--hosts", str(hosts), "--local-size",
                                                 str(local)), **{**SMALL, **env})
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == list(range(hosts * local)), res.stderr
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: {doc['failures'][:5]}"
        assert doc["size"] == hosts * local and doc["local_size"] == local
    digests = {json.dumps(d["digests"], sort_keys=True) for d in out.values()}
    assert len(digests) == 1, "ranks disagree on results"
    return out


@pytest.mark.parametrize("hosts,local,env", [
    (2, 1, {}),                                        # local size 1: no local stage
    (2, 2, {}),                                        # default: local rank 0 is the client
    (2, 2, {"BYTEPS_LOCAL_REDUCE": "slice"}),          # one network client per slice
    (1, 3, {}),                                        # one host: no network at all
    (2, 3, {"BYTEPS_PCIE_SWITCH_SIZE": "2"}),          # two-level: groups [0,1] + [2]
], ids=["2x1", "2x2-root", "2x2-slice", "1x3", "2x3-groups"])
def test_sums_and_averages(tmp_path, hosts, local, env):
    out = _run(tmp_path, hosts, local, servers=2 if hosts > 1 else 1, **env)
    assert all(d["reducer"] == (local > 1) for d in out.values())


def _bytes_by_host(tmp_path, tag, hosts, local, **env):
    rec = tmp_path / f"rec-{tag}"
    res = run_script("local_bytes.py", 2, workers=hosts * local, servers=2, timeout=180,
                     launcher_args=("--hosts", str(hosts), "--local-size", str(local)),
                     BYTEPS_TEST_RECORD=rec, **{**SMALL, **env},
                     BYTEPS_AUTOTUNE="0")   # the probe at init() would add its own bytes
    assert_ok(res)
    by_host: dict[str, int] = {}
    files = list(tmp_path.glob(f"rec-{tag}.bytes.*.json"))
    assert len(files) == 2, f"expected one byte count per server, got {files}"
    for f in files:
        for h, n in json.loads(f.read_text())["by_host"].items():
            by_host[h] = by_host.get(h, 0) + n
    return by_host


@pytest.mark.parametrize("local,mode", [(2, "1"), (3, "slice")])
def test_bytes_at_servers_per_host(tmp_path, local, mode):
    """With local reduction a host sends 1/local_size of what its workers send unreduced."""
    plain = _bytes_by_host(tmp_path, "off", 2, local, BYTEPS_LOCAL_REDUCE="0")
    reduced = _bytes_by_host(tmp_path, "on", 2, local, BYTEPS_LOCAL_REDUCE=mode)
    per_round = (6 * 1000 + 6 * 7 + 6 * 3001) * 4          # float32 bytes of one worker
    assert plain == {"host0": 2 * local * per_round, "host1": 2 * local * per_round}
    assert reduced == {"host0": 2 * per_round, "host1": 2 * per_round}
    for h in plain:
        assert reduced[h] * local == plain[h]


def test_kill_nonroot_local_worker(tmp_path):
    job = f"lkill-{secrets.token_hex(4)}"
    t0 = time.time()
    res = run_script("local_kill.py", tmp_path, workers=4, servers=1, timeout=90,
                     launcher_args=("--hosts", "2", "--local-size", "2"), BYTEPS_JOB_ID=job)
    t_end = time.time()
    assert res.returncode != 0
    info = json.loads((tmp_path / "killed.json").read_text())
    assert info["files"], "the job had no shared-memory files before the kill"
    assert t_end - info["t"] < 10, f"job took {t_end - info['t']:.1f} s to end after the kill"
    assert "host host0, local rank 1" in res.stderr and "SIGKILL" in res.stderr, res.stderr
    left = [f for f in os.listdir("/dev/shm") if f.startswith(job_prefix(job))]
    assert left == [], f"left in /dev/shm: {left}"
    assert t_end - t0 < 90


def test_mismatched_shapes_between_local_ranks(tmp_path):
    """Local ranks pushing different shapes under one name get an error naming the tensor."""
    res = run_script("local_mismatch.py", workers=2, servers=1, timeout=90,
                     launcher_args=("--hosts", "1", "--local-size", "2"))
    assert res.returncode != 0
    assert "tensor 'bad'" in res.stderr and "same shape" in res.stderr, res.stderr


@pytest.mark.parametrize("local,switch", [(4, 2), (2, 2)], ids=["two-level", "one-group"])
def test_prereduced_shares_gpu_cpu_half(tmp_path, local, switch):
    """The CPU half of the GPU path: group sums handed over (as NCCL would) are completed."""
    res = run_script("local_prereduced.py", tmp_path, workers=2 * local, servers=1, timeout=240,
                     launcher_args=("--hosts", "2", "--local-size", str(local)),
                     BYTEPS_PCIE_SWITCH_SIZE=switch, **SMALL)
    assert_ok(res)
    out = read_results(tmp_path)
    assert len(out) == 2 * local
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: {doc['failures'][:5]}"
        assert doc["two_level"] == (local // switch > 1)



def test_peer_death_detected_without_bpslaunch(tmp_path):
    """Local workers started by hand (no supervising launcher): when local rank 1 is
    killed, local rank 0 fails within seconds naming the host and the local rank."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT, SCRIPTS, job_env

    from byteps.launcher import free_port
    job = f"lpeer-{secrets.token_hex(3)}"
    env = job_env(DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT=free_port(), BYTEPS_JOB_ID=job,
                  BYTEPS_JOB_SECRET=secrets.token_hex(16), BYTEPS_LOCAL_SIZE=2, DMLC_WORKER_ID=0)
    py = sys.executable
    procs = [subprocess.Popen([py, "-m", "byteps.scheduler"], env=dict(env, DMLC_ROLE="scheduler"),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([py, "-m", "byteps.server"], env=dict(env, DMLC_ROLE="server"),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    workers = [subprocess.Popen([py, str(SCRIPTS / "local_kill.py"), str(tmp_path)], cwd=ROOT,
                                env=dict(env, DMLC_ROLE="worker", BYTEPS_LOCAL_RANK=str(lr),
                                         BYTEPS_EMULATED_HOST="host0"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for lr in (0, 1)]
    procs += workers
    try:
        _, err = workers[0].communicate(timeout=60)
        info = json.loads((tmp_path / "killed.json").read_text())
        assert workers[1].wait(10) == -signal.SIGKILL
        assert workers[0].returncode != 0
        assert time.time() - info["t"] < 10
        assert "host host0: local rank 1" in err and "died" in err, err[-3000:]
        # the survivor removed the host's shared memory (the dead rank's files included)
        mine = [f for f in os.listdir("/dev/shm") if f.startswith(host_prefix(job, "host0"))]
        assert mine == [], mine
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_reinit_with_local_reduction():
    """shutdown() + init() three times: each epoch gets a fresh shared-memory namespace
    (with colocated worker/server payloads through shared memory, the default, and without)."""
    for ipc in (1, 0):
        res = run_script("local_reinit.py", workers=4, servers=1, timeout=120,
                         launcher_args=("--hosts", "2", "--local-size", "2"),
                         BYTEPS_ENABLE_IPC=ipc, **SMALL)
        assert_ok(res)


@pytest.mark.parametrize("hosts,tmpfs_mb,tensor_mb", [(1, 16, 50), (2, 32, 20)],
                         ids=["1x2-smaller-chunks", "2x2-window"])
def test_small_shm_dir_reduces_through_a_window(tmp_path, small_tmpfs, hosts, tmpfs_mb,
                                                tensor_mb):
    """Docker's small /dev/shm: a tensor whose shared buffer (3 x its size) does not fit
    is reduced through a window of chunks (smaller chunks without a network stage), exact
    results, one warning per host naming the fix, never a SIGBUS."""
    shm = small_tmpfs(tmpfs_mb)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # colocated servers would put their payload segments into the same small tmpfs
    # (BYTEPS_ENABLE_IPC), leaving less than a window to the host created last
    res = run_script("local_small_shm.py", out_dir, 3, tensor_mb, workers=2 * hosts,
                     servers=hosts, timeout=180,
                     launcher_args=("--hosts", str(hosts), "--local-size", "2"),
                     BYTEPS_SHM_DIR=shm, BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    out = read_results(out_dir)
    assert sorted(out) == list(range(2 * hosts))
    for r, doc in out.items():
        assert doc["failures"] == [] and doc["reducer"], f"rank {r}: {doc}"
    warnings = [ln for ln in res.stderr.splitlines() if "shared buffer of tensor 'big'" in ln]
    assert len(warnings) == hosts, res.stderr[-4000:]
    assert "--shm-size" in warnings[0] and "BYTEPS_SHM_DIR" in warnings[0]
    assert os.listdir(shm) == []


def test_shm_dir_too_small_for_any_window_is_a_clear_error(tmp_path, small_tmpfs):
    """With a network stage the chunks keep their size; when not even one fits the job
    ends at once with the fix (not a SIGBUS, not a hang)."""
    shm = small_tmpfs(8)
    res = run_script("local_small_shm.py", tmp_path, 1, 20, workers=4, servers=1, timeout=90,
                     launcher_args=("--hosts", "2", "--local-size", "2"),
                     BYTEPS_SHM_DIR=shm)
    assert res.returncode not in (0, 135, -7), res.stderr[-3000:]
    assert "cannot reserve shared memory for the local reduction" in res.stderr
    assert "BYTEPS_LOCAL_REDUCE=0" in res.stderr and "--shm-size" in res.stderr

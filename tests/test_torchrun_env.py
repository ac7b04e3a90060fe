"""torchrun-style variables: every worker's RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE equal
what BytePS assigns; torchrun without BytePS configuration warns once at init()."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from conftest import BPSLAUNCH, ROOT, SCRIPTS, assert_ok, job_env, read_results

from byteps.common import torchrun
from byteps.launcher import free_port


def test_torchrun_env_unit():
    assert torchrun.torchrun_env(1, 2, 4, 3) == {
        "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "6", "WORLD_SIZE": "12",
        "GROUP_RANK": "1", "NODE_RANK": "1",
        # horovodrun's names, which Horovod's test_horovod_rank reads before init()
        "HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_RANK": "6",
        "HOROVOD_SIZE": "12", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "3"}
    # without a host index only the local values are known; stale global ones are removed
    env = torchrun.apply({"RANK": "9", "WORLD_SIZE": "99", "HOROVOD_RANK": "9", "X": "1"},
                         None, 0, 2, 3)
    assert env == {"X": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                   "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}


def test_warning_once_under_torchrun_without_byteps(monkeypatch):
    monkeypatch.setattr(torchrun, "_WARNED", False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not torchrun.warn_if_torchrun_without_byteps(True, {"WORLD_SIZE": "4"})
        assert not torchrun.warn_if_torchrun_without_byteps(False, {"WORLD_SIZE": "1"})
        assert torchrun.warn_if_torchrun_without_byteps(False, {"WORLD_SIZE": "4",
                                                                "RANK": "2"})
        assert not torchrun.warn_if_torchrun_without_byteps(False, {"WORLD_SIZE": "4"})
    assert len(w) == 1 and "separate single-process jobs" in str(w[0].message)
    assert "bpslaunch -np 4" in str(w[0].message)


def test_init_warns_under_torchrun_env():
    """A plain process with torchrun's variables and no DMLC_*: one warning, then it runs
    alone (size 1)."""
    code = ("import byteps.numpy as bps; bps.init(); bps.shutdown(); bps.init(); "
            "print('size', bps.size())")
    env = job_env(WORLD_SIZE=2, RANK=1, LOCAL_RANK=1, TORCHELASTIC_RUN_ID="x")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr
    assert "size 1" in res.stdout
    assert res.stderr.count("separate single-process jobs") == 1, res.stderr


@pytest.mark.timeout(120)
def test_standalone_workers_get_byteps_ranks(tmp_path):
    res = subprocess.run(BPSLAUNCH + ["--hosts", "2", "--local-size", "2", "-s", "1",
                                      sys.executable, str(SCRIPTS / "rank_env.py"),
                                      str(tmp_path)],
                         env=job_env(BYTEPS_ENABLE_IPC=0), capture_output=True, text=True,
                         timeout=100, cwd=ROOT, check=False)
    assert_ok(res)
    docs = read_results(tmp_path)
    assert sorted(docs) == [0, 1, 2, 3]
    for rank, d in docs.items():
        assert d["env"] == {"RANK": str(rank), "LOCAL_RANK": str(d["local_rank"]),
                            "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                            "GROUP_RANK": str(rank // 2), "NODE_RANK": str(rank // 2)}
        assert d["before_init"] == {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "4"}
        assert d["size"] == 4 and d["local_size"] == 2


@pytest.mark.timeout(120)
def test_cluster_mode_ranks_follow_worker_id(tmp_path):
    """One bpslaunch per role, worker hosts started in reverse order: RANK still follows
    DMLC_WORKER_ID (as the scheduler assigns ranks)."""
    port = free_port()
    base = {"DMLC_NUM_WORKER": 2, "DMLC_NUM_SERVER": 1, "DMLC_PS_ROOT_URI": "127.0.0.1",
            "DMLC_PS_ROOT_PORT": port, "BYTEPS_ENABLE_IPC": 0, "BYTEPS_JOB_SECRET": "s" * 32}
    procs = [subprocess.Popen(BPSLAUNCH, env=job_env(**base, DMLC_ROLE=r), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in ("scheduler", "server")]
    workers = [subprocess.Popen(
        BPSLAUNCH + ["--local-size", "2", sys.executable, str(SCRIPTS / "rank_env.py"),
                     str(tmp_path)],
        env=job_env(**base, DMLC_ROLE="worker", DMLC_WORKER_ID=wid,
                    BYTEPS_EMULATED_HOST=f"h{wid}"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for wid in (1, 0)]
    try:
        for w in workers:
            out, _ = w.communicate(timeout=90)
            assert w.returncode == 0, out
    finally:
        for p in procs + workers:
            p.kill()
            p.wait()
    docs = read_results(tmp_path)
    assert sorted(docs) == [0, 1, 2, 3]
    for rank, d in docs.items():
        assert d["env"]["RANK"] == str(rank) and d["env"]["WORLD_SIZE"] == "4"
        assert d["env"]["LOCAL_RANK"] == str(rank % 2)


def test_master_addr_and_port_unit():
    env = torchrun.apply({"X": "1"}, 0, 1, 2, 1, ("127.0.0.1", 29500))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
    mine = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}     # the user's win
    assert torchrun.apply(mine, 0, 0, 1, 1, ("127.0.0.1", 29500))["MASTER_ADDR"] == "10.0.0.1"


@pytest.mark.timeout(150)
def test_init_process_group_and_distributed_sampler_under_bpslaunch(tmp_path):
    """bpslaunch -np 2 and a torchrun-style script: init_process_group("gloo") with the
    default env:// rendezvous, a default DistributedSampler, a gloo all_reduce; torch's
    ranks equal BytePS's."""
    pytest.importorskip("torch")
    res = subprocess.run(BPSLAUNCH + ["-np", "2", sys.executable,
                                      str(SCRIPTS / "torch_ddp_env.py"), str(tmp_path)],
                         env=job_env(), capture_output=True, text=True, timeout=140,
                         cwd=ROOT, check=False)
    assert_ok(res)
    docs = read_results(tmp_path)
    assert sorted(docs) == [0, 1]
    for rank, d in docs.items():
        assert (d["rank"], d["world"], d["bps_rank"], d["bps_size"]) == (rank, 2, rank, 2)
        assert d["indices"] == list(range(rank, 10, 2)) and d["sum"] == 3.0
        assert d["master"][0] == "127.0.0.1" and d["master"] == docs[0]["master"]

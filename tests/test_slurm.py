"""``bpslaunch --slurm``: node-list expansion and role assignment from recorded task
environments, and fake ``srun`` runs (one bpslaunch per task with its SLURM_* values; on
loopback, and as root one network namespace per node)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BPSLAUNCH, ROOT, SCRIPTS, job_env, read_results

from byteps.launcher import free_port
from byteps.launcher.slurm import SlurmError, expand_nodelist, expand_tasks_per_node, place

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"


def fixture_env(name: str) -> dict[str, str]:
    env = {}
    for line in (FIXTURES / name).read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    return env


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu-a[07-08,11],gpu-b03", ["gpu-a07", "gpu-a08", "gpu-a11", "gpu-b03"]),
    ("a[8-10]", ["a8", "a9", "a10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("x[1-2]-ib,y", ["x1-ib", "x2-ib", "y"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
])
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, msg", [("n[1-2", "unbalanced"), ("n[3-1]", "backwards"),
                                       ("n[a-b]", "cannot read"), ("", "empty")])
def test_bad_nodelists(text, msg):
    with pytest.raises(SlurmError, match=msg):
        expand_nodelist(text)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]


def test_gpu_allocation_task_is_one_worker():
    pl = place(fixture_env("gpu4x8.node2.task5.env"))
    assert pl.nodes == ["gpu-a07", "gpu-a08", "gpu-a11", "gpu-b03"]
    assert (pl.node_id, pl.local_ranks, pl.local_size) == (2, [5], 8)
    assert not pl.scheduler and pl.servers == 0 and pl.num_servers == 4
    assert pl.root_uri == "gpu-a07" and pl.job_id == "slurm-481516.0"
    # every task of the allocation: one scheduler, one server per node, ranks 0..31
    env = fixture_env("gpu4x8.node2.task5.env")
    pls = [place(dict(env, SLURM_NODEID=str(n), SLURM_LOCALID=str(t)))
           for n in range(4) for t in range(8)]
    assert sum(p.scheduler for p in pls) == 1 and pls[0].scheduler
    assert sum(p.servers for p in pls) == 4
    assert len({p.port for p in pls}) == 1
    ranks = sorted(p.node_id * p.local_size + lr for p in pls for lr in p.local_ranks)
    assert ranks == list(range(32))
    # more servers than nodes: round robin over the nodes' local task 0
    pls = [place(dict(env, SLURM_NODEID=str(n), SLURM_LOCALID="0"), num_servers=6)
           for n in range(4)]
    assert [p.servers for p in pls] == [2, 2, 1, 1]


def test_one_task_per_node_with_local_size():
    pl = place(fixture_env("cpu3x1.node0.task0.env"), local_size=2)
    assert pl.nodes == ["node01", "node02", "node03"] and pl.scheduler and pl.servers == 1
    assert pl.local_ranks == [0, 1] and pl.local_size == 2 and pl.job_id == "slurm-9001.3"


def test_refusals_name_the_fix():
    with pytest.raises(SlurmError, match="same number on every node"):
        place(fixture_env("uneven.node1.task0.env"))
    with pytest.raises(SlurmError, match="--ntasks-per-node=1"):
        place(fixture_env("gpu4x8.node2.task5.env"), local_size=8)
    with pytest.raises(SlurmError, match="SLURM_JOB_NODELIST is not set"):
        place({})
    with pytest.raises(SlurmError, match="SLURM_NODEID is not set"):
        place({"SLURM_JOB_NODELIST": "n[1-2]"})
    with pytest.raises(SlurmError, match="names 2 nodes"):
        place({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "3", "SLURM_NODEID": "0",
               "SLURM_LOCALID": "0"})


def test_outside_slurm_is_one_line():
    res = subprocess.run(BPSLAUNCH + ["--slurm", sys.executable, "-c", "pass"],
                         env=job_env(), capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=False)
    assert res.returncode == 2 and "SLURM_JOB_NODELIST is not set" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_missing_secret_is_one_line():
    env = job_env(SLURM_JOB_NODELIST="n1", SLURM_NNODES=1, SLURM_NODEID=0, SLURM_LOCALID=0,
                  SLURM_NTASKS_PER_NODE=1)
    res = subprocess.run(BPSLAUNCH + ["--slurm", sys.executable, "-c", "pass"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert res.returncode == 2 and "openssl rand -hex 32" in res.stderr


# ------------------------------------------------------------------ fake srun
def srun_envs(nodelist: str, nnodes: int, per_node: int, port: int) -> list[dict]:
    """The environment of every task of a step, as srun would set it."""
    out = []
    for n in range(nnodes):
        for t in range(per_node):
            out.append({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
                        "SLURM_JOB_NODELIST": nodelist, "SLURM_NNODES": str(nnodes),
                        "SLURM_NTASKS": str(nnodes * per_node),
                        "SLURM_NTASKS_PER_NODE": str(per_node),
                        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nnodes})",
                        "SLURM_NODEID": str(n), "SLURM_LOCALID": str(t),
                        "SLURM_PROCID": str(n * per_node + t), "DMLC_PS_ROOT_PORT": str(port),
                        "BYTEPS_JOB_SECRET": "f" * 64, "BYTEPS_ENABLE_IPC": "0"})
    return out


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, "\n---\n".join(outs)
    return outs


@pytest.mark.timeout(150)
def test_fake_srun_on_loopback_ranks_follow_slurm(tmp_path):
    """2 nodes x 2 tasks as 4 bpslaunch --slurm processes (nodes 127.0.0.1 and .2)."""
    envs = srun_envs("127.0.0.[1-2]", 2, 2, free_port())
    procs = [subprocess.Popen(BPSLAUNCH + ["--slurm", sys.executable,
                                           str(SCRIPTS / "rank_env.py"), str(tmp_path)],
                              env=job_env(**e), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for e in reversed(envs)]
    wait_all(procs, 120)
    docs = read_results(tmp_path)
    assert sorted(docs) == [0, 1, 2, 3]
    for rank, d in docs.items():
        assert (d["size"], d["local_size"], d["local_rank"]) == (4, 2, rank % 2)
        assert d["env"]["RANK"] == str(rank) and d["env"]["NODE_RANK"] == str(rank // 2)
        # torch's env:// rendezvous: the first node and one port, alike on every task
        assert d["other"]["MASTER_ADDR"] == "127.0.0.1", d["other"]
    assert len({d["other"]["MASTER_PORT"] for d in docs.values()}) == 1, docs


@pytest.mark.timeout(240)
def test_fake_srun_one_network_namespace_per_node(tmp_path):
    """Nodes node01 and node02 as network namespaces (names in their hosts files), one
    task each: the scheduler and a server beside each worker; digits reaches 95 %."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import podnet
    why = podnet.skip_reason()
    if why:
        pytest.skip(why)
    envs = srun_envs("node[01-02]", 2, 1, 29500)
    with podnet.PodNet(["node01", "node02"]) as net:
        procs = []
        for e in envs:
            node = ["node01", "node02"][int(e["SLURM_NODEID"])]
            env = dict(job_env(**e), PYTHONUNBUFFERED="1")
            argv = net.argv(node, env, [*BPSLAUNCH, "--slurm", sys.executable,
                                        str(ROOT / "examples/torch/train_digits.py")])
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = wait_all(procs, 200)
    accs = [float(a) for a in re.findall(r"test_acc=([0-9.]+)", outs[0])]
    assert accs and accs[-1] >= 0.95, outs[0]

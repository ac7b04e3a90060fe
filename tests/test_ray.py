"""byteps.ray.RayExecutor on a local Ray cluster (ray.init(num_cpus=4)): numpy sums per
rank, a small torch training run with identical weights on every rank, a failing
train_fn named by rank and host, no process left after shutdown()."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAVE_RAY, reason="Ray is not installed: pip install 'byteps-ps[ray]' to run these")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray import cloudpickle
    # the train functions below live in this test module, which Ray's worker processes
    # cannot import: send them by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 << 20,
             log_to_driver=True, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def executor(ray_cluster):
    from byteps.ray import RayExecutor
    made = []

    def make(**kw):
        ex = RayExecutor(**kw)
        made.append(ex)
        ex.start()
        return ex
    yield make
    for ex in made:
        ex.shutdown()


def sums(scale):
    import byteps.numpy as bps
    bps.init()
    r, n = bps.rank(), bps.size()
    total = bps.push_pull(np.arange(6, dtype=np.float64) * (r + 1), name="x", average=False)
    avg = bps.push_pull(np.full(3, float(r)), name="y", average=True)
    return {"rank": r, "size": n, "sum": (total * scale).tolist(), "avg": avg.tolist(),
            "env_rank": os.environ.get("RANK"), "worker_id": os.environ["DMLC_WORKER_ID"]}


@needs_ray
def test_numpy_push_pull_sums_per_rank(executor):
    ex = executor(num_workers=2, num_servers=1, cpus_per_worker=1)
    t0 = time.monotonic()
    out = ex.run(sums, args=(2.0,))
    assert [o["rank"] for o in out] == [0, 1]
    for i, o in enumerate(out):
        assert o["size"] == 2 and o["worker_id"] == str(i) and o["env_rank"] == str(i)
        assert o["sum"] == (np.arange(6) * 3 * 2.0).tolist()      # (1 + 2) * x * scale
        assert o["avg"] == [0.5] * 3
    # a second run is a new job on the same actors
    assert [o["rank"] for o in ex.run(sums, kwargs={"scale": 1.0})] == [0, 1]
    assert time.monotonic() - t0 < 30


def train_digits(epochs):
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    import byteps.torch as bps
    bps.init()
    torch.set_num_threads(1)
    rank, size = bps.rank(), bps.size()
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target, test_size=0.25, random_state=0,
                                              stratify=d.target)
    x_tr, y_tr = torch.from_numpy(x_tr), torch.from_numpy(y_tr).long()
    torch.manual_seed(rank)                       # different: the broadcast must fix it
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = bps.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator().manual_seed(1)
    batch = 32
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        for s in range(0, len(perm) - batch * size + 1, batch * size):
            idx = perm[s + rank * batch:s + (rank + 1) * batch]
            opt.zero_grad()
            F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean()
    weights = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    return rank, float(acc), weights


@needs_ray
def test_torch_training_identical_weights(executor):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    ex = executor(num_workers=2, num_servers=1, strategy="SPREAD")
    out = ex.run(train_digits, args=(6,))
    assert [r for r, _, _ in out] == [0, 1]
    for _, acc, _ in out:
        assert acc > 0.9, out
    np.testing.assert_array_equal(out[0][2], out[1][2])


def fails_on_rank_1():
    import byteps.numpy as bps
    bps.init()
    bps.push_pull(np.ones(4), name="before")
    if bps.rank() == 1:
        raise ValueError("bad batch on purpose")
    bps.push_pull(np.ones(4), name="after")      # rank 0 waits here for rank 1
    return bps.rank()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def _job_processes(job_id: str) -> list[int]:
    """Processes whose environment names this job (its scheduler and servers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"BYTEPS_JOB_ID={job_id}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _wait_gone(pids, timeout=10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@needs_ray
def test_failing_train_fn_names_rank_and_host(executor):
    from byteps.ray import RayExecutorError, WorkerFailedError
    ex = executor(num_workers=2, num_servers=1)
    worker_pids = [ex._hosts[f"worker {i}"]["pid"] for i in range(2)]
    host = ex.hosts()["worker 1"]
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        ex.run(fails_on_rank_1)
    assert time.monotonic() - t0 < 20
    err = info.value
    assert err.rank == 1 and err.host == host
    assert "rank 1" in str(err) and host in str(err) and "bad batch on purpose" in str(err)
    assert "ValueError" in err.cause and "fails_on_rank_1" in err.remote_traceback
    # the other actors and processes were ended; the executor says to start again
    services = list(ex._service_pids.values())
    assert not _wait_gone(worker_pids + services), "actors or byteps processes left behind"
    with pytest.raises(RayExecutorError, match="start"):
        ex.run(sums, args=(1.0,))


@needs_ray
def test_shutdown_leaves_no_process(executor):
    ex = executor(num_workers=2, num_servers=2)
    assert ex.run(sums, args=(1.0,))[1]["rank"] == 1
    pids = [h["pid"] for h in ex._hosts.values()] + list(ex._service_pids.values())
    ex.shutdown()
    assert not _wait_gone(pids), "processes left after shutdown()"
    assert not _wait_gone(_job_processes(ex.job_id)), "byteps processes of the job left"


def kills_the_server():
    import signal

    import byteps.numpy as bps
    bps.init()
    bps.push_pull(np.ones(4), name="before")
    if bps.rank() == 0:
        for pid in _job_processes(os.environ["BYTEPS_JOB_ID"]):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"byteps.server" in f.read():
                    os.kill(pid, signal.SIGKILL)
    for i in range(100):
        bps.push_pull(np.ones(4), name=f"after{i}")
        time.sleep(0.1)
    return bps.rank()


@needs_ray
def test_server_that_dies_is_named(executor):
    from byteps.ray import RayExecutorError
    ex = executor(num_workers=2, num_servers=1, env={"BYTEPS_HEARTBEAT_TIMEOUT": "3"})
    with pytest.raises(RayExecutorError) as info:
        ex.run(kills_the_server)
    text = str(info.value)
    # whichever is seen first: the server's exit, or a worker told the server is gone
    assert ("server 0" in text and "code -9" in text) or "rank" in text, text
    assert not _wait_gone(list(ex._service_pids.values()))


@needs_ray
def host_sums(executable):
    """Horovod's execute(fn): fn(executable); byteps passes None."""
    import byteps.numpy as bps
    bps.init()
    got = bps.push_pull(np.full(4, float(bps.rank() + 1)), name="h", average=False)
    return {"executable": executable, "rank": bps.rank(), "size": bps.size(),
            "local": (bps.local_rank(), bps.local_size()), "sum": got.tolist(),
            "horovod": (os.environ["HOROVOD_RANK"], os.environ["HOROVOD_LOCAL_SIZE"]),
            "timeout": os.environ.get("BYTEPS_STARTUP_TIMEOUT"),
            "extra": os.environ.get("BPS_TEST_EXTRA")}


@needs_ray
def test_horovods_ray_api_with_a_host_of_two(executor):
    """Horovod's Ray script, import changed: ``RayExecutor.create_settings(timeout_s=...)``,
    ``RayExecutor(settings, num_hosts=1, num_workers_per_host=2)``,
    ``start(extra_env_vars=...)``, ``execute(fn)`` and ``execute_single(fn)``.  The two
    workers of the host's bundle are local ranks 0 and 1 of one host (they reduce
    locally first) and sum with the server as one job of 2."""
    from byteps.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=40)
    ex = RayExecutor(settings, num_hosts=1, num_workers_per_host=2, cpus_per_worker=1)
    ex.start(extra_env_vars={"BPS_TEST_EXTRA": "yes"})
    try:
        out = ex.execute(host_sums)
        assert [o["rank"] for o in out] == [0, 1] and {o["size"] for o in out} == {2}
        assert [o["local"] for o in out] == [(0, 2), (1, 2)]
        assert [o["horovod"] for o in out] == [("0", "2"), ("1", "2")]
        for o in out:
            assert o["executable"] is None and o["sum"] == [3.0] * 4
            assert (o["timeout"], o["extra"]) == ("40", "yes")
        single = ex.execute_single(host_sums)          # worker 0 alone, a job of one
        assert (single["rank"], single["size"], single["sum"]) == (0, 1, [1.0] * 4)
    finally:
        ex.shutdown()


@needs_ray
def test_horovods_ray_arguments_byteps_cannot_honour_are_refused():
    """Each with the reason and what to use: a number where the settings go, elastic
    arguments, callbacks (no ray_logger), an executable class, run_remote."""
    from byteps.ray import RayExecutor, RayExecutorError
    with pytest.raises(TypeError, match="give num_workers= by name"):
        RayExecutor(2)
    with pytest.raises(ValueError, match="bpslaunch --min-workers"):
        RayExecutor(None, min_workers=1, max_workers=4)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(None, num_workers=2, num_hosts=1)
    with pytest.raises(ValueError, match="one interface"):
        RayExecutor.create_settings(nics={"eth0", "eth1"})
    ex = RayExecutor(RayExecutor.create_settings(nics={"lo"}), num_workers=1)
    assert ex.env["DMLC_INTERFACE"] == "lo"
    with pytest.raises(ValueError, match="no ray_logger"):
        ex.run(sums, callbacks=[print])
    with pytest.raises(ValueError, match="build the object inside it"):
        ex.start(executable_cls=dict)
    with pytest.raises(RayExecutorError, match="use run"):
        ex.run_remote(sums)


def test_placement_that_cannot_fit_fails_fast(ray_cluster):
    from byteps.ray import RayExecutor, RayExecutorError
    ex = RayExecutor(num_workers=8, num_servers=1, placement_timeout_s=2)
    with pytest.raises(RayExecutorError, match="was not placed within 2 s"):
        ex.start()
    ex.shutdown()


def test_without_ray_says_how_to_install():
    code = ("import sys; sys.modules['ray'] = None\n"
            "try:\n    import byteps.ray\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, check=False)
    assert "pip install 'byteps-ps[ray]'" in out.stdout, out

"""byteps.torch.cross_barrier: the original BytePS's CrossBarrier (the next forward pass
overlaps the exchange), against DistributedOptimizer in real jobs."""
from __future__ import annotations

import os

import pytest
from conftest import assert_ok, read_results, run_script

torch = pytest.importorskip("torch")

PHASES = ["sgd", "adam", "adamw", "rmsprop", "fp16", "bpps2", "onebit", "join", "convbn",
          "addgroup", "unfreeze", "shutdown"]


def _check(res: dict, workers: int, phases: list) -> None:
    assert sorted(res) == list(range(workers)), f"missing ranks: {sorted(res)}"
    for ph in phases:
        r0 = res[0][ph]
        for r in range(1, workers):     # (after join() the rank that stopped early keeps its own)
            assert ph == "join" or res[r][ph]["checksum"] == r0["checksum"], f"{ph}: rank {r}"
        for r in range(workers):
            got = res[r][ph]
            # the same updates as DistributedOptimizer, to the last bit
            assert got["diff"] <= 1e-6 * got["scale"], f"{ph} rank {r}: {got}"
            # step() returned with updates still in flight (the barrier was crossed), the
            # model's state_dict() waited for them, and so did the step num_steps names
            assert got["crossed"] >= 1 and got["waited_mid"] and got["done"], f"{ph}: {got}"
        # rank 1 paused before its last backward: rank 0's shutdown() had to wait
        assert ph != "shutdown" or res[0][ph]["inflight"] >= 1, res[0][ph]


@pytest.mark.timeout(120)
def test_cross_barrier_trains_as_distributed_optimizer(tmp_path):
    """SGD (Nesterov, weight decay), Adam, AdamW, RMSprop, fp16 compression,
    backward_passes_per_step=2, onebit with error feedback, and join() after uneven steps
    (odd ranks stop 3 steps early), each with an lr scheduler that changes the lr while
    updates are in flight, a parameter group added at step 3 (each rank's own values:
    broadcast from rank 0; was: never averaged, the ranks diverged), a head frozen at the
    start and unfrozen at step 3 (was: the same), a small ResNet
    (convolutions, batch norms: their running statistics compared too), and bps.shutdown()
    right after the last step (its updates are applied first: was, lost, and the background
    thread died on the closed job); first a shape mismatch: the background thread's error
    reaches every rank's loop, and the job stays usable (rank 1's backward pass pauses until its
    error is back: it still pushes every gradient, else rank 0 would wait for them)."""
    # onebit's scale is per partition, and autotune's trials may cut the two runs
    # differently; join() this early needs autotune's settings fixed (docs/compatibility.md,
    # "Known gaps"); the test below keeps autotune's defaults
    assert_ok(run_script("cross_barrier_job.py", tmp_path, "mismatch", *PHASES, workers=2,
                         servers=2, timeout=110, BYTEPS_PARTITION_BYTES="262144",
                         BYTEPS_SCHEDULING_CREDIT="4"))
    res = read_results(tmp_path)
    _check(res, 2, PHASES)
    for r in (0, 1):
        got = res[r]["mismatch"]
        assert got["error"] and "Gradient.mm.2." in got["error"], got
        assert "rank 1" in got["error"] and "rank 0" in got["error"], got
        assert got["after"] == [0.5, 0.5, 0.5], got


@pytest.mark.timeout(120)
def test_cross_barrier_with_local_reduction(tmp_path):
    """2 hosts of 2 workers: the host's local reduction under the crossed barrier, with
    autotune's defaults (its partition trials and its hold until step())."""
    assert_ok(run_script("cross_barrier_job.py", tmp_path, "sgd", "adam", workers=4,
                         servers=1, timeout=110,
                         launcher_args=("--hosts", "2", "--local-size", "2")))
    _check(read_results(tmp_path), 4, ["sgd", "adam"])


@pytest.fixture
def local_job(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("DMLC_", "BYTEPS_")):
            monkeypatch.delenv(k)
    import byteps.torch.cross_barrier as bps
    bps.init()
    yield bps
    bps.shutdown()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


@pytest.mark.timeout(60)
def test_the_module_is_the_original_import_and_refuses_what_cannot_cross(local_job):
    bps = local_job
    import byteps.torch
    for name in byteps.torch.__all__:
        assert getattr(bps, name) is getattr(byteps.torch, name), name
    assert bps.suspend is byteps.torch.suspend and callable(bps.CrossBarrier)
    m = _model()
    with pytest.raises(TypeError, match="LBFGS takes one step over all parameters"):
        bps.CrossBarrier(m, torch.optim.LBFGS(m.parameters()))
    with pytest.raises(ValueError, match="not parameters of the model"):
        bps.CrossBarrier(_model(), torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="num_steps must be an int >= 1"):
        bps.CrossBarrier(m, torch.optim.SGD(m.parameters(), lr=0.1), num_steps=0)
    with pytest.raises(TypeError, match="torch.nn.Module being trained first"):
        bps.CrossBarrier(torch.optim.SGD(m.parameters(), lr=0.1), m)


@pytest.mark.timeout(60)
def test_an_algorithm_takes_its_own_step(local_job):
    """With an algorithm other than SyncPS there is no gradient exchange to cross: the
    algorithm's step runs (as DistributedOptimizer's) and the model trains."""
    bps = local_job
    m = _model()
    opt = bps.CrossBarrier(m, torch.optim.SGD(m.parameters(), lr=0.1),
                           algorithm=bps.algorithms.DiLoCo(inner_steps=2),
                           named_parameters=[("alg." + n, p) for n, p in m.named_parameters()])
    x = torch.randn(8, 3)
    first = m(x).pow(2).sum().item()
    for _ in range(6):
        opt.zero_grad()
        m(x).pow(2).sum().backward()
        opt.step()
    opt.finish()
    assert m(x).pow(2).sum().item() < first
    assert isinstance(opt, torch.optim.SGD)
    m.extra = torch.nn.Parameter(torch.zeros(2))     # the model's, not the optimizer's yet
    with pytest.raises(ValueError, match="rule 'algorithm-param-group'"):
        opt.add_param_group({"params": [m.extra]})
    assert len(opt.param_groups) == 1


@pytest.mark.timeout(60)
def test_a_dropped_cross_barrier_is_collected_and_its_thread_ends(local_job):
    """The background thread and the gradient hooks hold the optimizer weakly: a script
    that builds a new model and optimizer per trial does not keep every old model alive
    (nor a CrossBarrier's thread).  Was: every DistributedOptimizer lived to the end."""
    import gc
    import weakref
    bps = local_job
    m = _model()
    opt = bps.CrossBarrier(m, torch.optim.SGD(m.parameters(), lr=0.1),
                           named_parameters=[("gc." + n, p) for n, p in m.named_parameters()])
    for _ in range(2):
        m(torch.randn(8, 3)).pow(2).sum().backward()
        opt.step()
    opt.synchronize()
    thread, ref = opt._cb_thread, weakref.ref(opt)
    param = weakref.ref(next(m.parameters()))
    assert thread.is_alive()
    del opt, m
    gc.collect()
    thread.join(10)
    assert ref() is None and not thread.is_alive()
    assert param() is None                          # nor the model
    m = _model()                                    # a DistributedOptimizer alike
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=[("gc2." + n, p)
                                                     for n, p in m.named_parameters()])
    m(torch.randn(8, 3)).pow(2).sum().backward()
    opt.step()
    ref, param = weakref.ref(opt), weakref.ref(next(m.parameters()))
    del opt, m
    gc.collect()
    assert ref() is None and param() is None

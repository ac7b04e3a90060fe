"""byteps.torch without a network: a local job of size 1 inside the test process."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import byteps.torch as bps
from byteps.torch import _objects

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def local_job(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("DMLC_", "BYTEPS_")):
            monkeypatch.delenv(k)
    bps.init()
    assert bps.size() == 1
    yield
    bps.shutdown()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _backward(model, n=1):
    for _ in range(n):
        model(torch.randn(5, 3)).sum().backward()


# ---------------------------------------------------------------- ops
def test_push_pull_variants_and_dtypes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = bps.push_pull(t, name="u.a")
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()
    for dt in (torch.bfloat16, torch.int16, torch.bool, torch.float64, torch.int8):
        x = (torch.arange(4) % 2).to(dt)
        assert torch.equal(bps.push_pull(x, average=False, name=f"u.{dt}"), x)
    nc = torch.arange(12.).reshape(3, 4).t()                     # non-contiguous, in place
    before = nc.clone()
    assert bps.push_pull_inplace(nc, name="u.nc") is nc and torch.equal(nc, before)
    h = bps.push_pull_async(torch.ones(3), name="u.async")
    assert bps.poll(h) in (True, False)
    assert torch.equal(bps.synchronize(h), torch.ones(3))
    assert bps.push_pull(torch.tensor(2.5), name="u.scalar").item() == 2.5
    assert bps.declare("u.declared") == 0


def test_push_pull_without_name_and_autograd():
    a = bps.push_pull(torch.ones(2))
    b = bps.push_pull(torch.ones(3))                 # a new generated name, new shape is fine
    assert a.shape == (2,) and b.shape == (3,)
    x = torch.ones(3, requires_grad=True)
    (bps.push_pull(x * 2, name="u.grad") * torch.tensor([1., 2., 3.])).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]


def test_push_pull_errors():
    with pytest.raises(TypeError, match="complex"):
        bps.push_pull(torch.ones(2, dtype=torch.complex64), name="u.cplx")
    with pytest.raises(TypeError, match="torch.Tensor"):
        bps.push_pull_async(np.ones(2), name="u.np")
    bps.push_pull(torch.ones(2), name="u.shape")
    # as Horovod, a name may be used again with another shape (byteps/core/pipeline/redeclare.py)
    assert bps.push_pull(torch.ones(3), name="u.shape").shape == (3,)
    with pytest.raises(ValueError, match="handle"):
        bps.synchronize(987654)


def test_fp16_compression_leaves_integers_alone():
    c = bps.Compression.fp16
    f, ctx = c.compress(torch.ones(3))
    assert f.dtype == torch.float16 and c.decompress(f, ctx).dtype == torch.float32
    i = torch.arange(3)
    ci, ctx = c.compress(i)
    assert ci is i and c.decompress(ci, ctx) is i
    assert bps.push_pull(torch.arange(5), name="u.int.fp16", compression=c).dtype == torch.int64


# ---------------------------------------------------------------- optimizer
def test_distributed_optimizer_is_instance_and_steps():
    m = _model()
    base = torch.optim.Adam(m.parameters(), lr=0.1)
    opt = bps.DistributedOptimizer(base, named_parameters=m.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
    before = [p.clone() for p in m.parameters()]
    opt.zero_grad()
    _backward(m)
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert len(opt.state_dict()["state"]) == 4
    with pytest.raises(TypeError, match="already"):
        bps.DistributedOptimizer(opt)


def test_duplicate_and_partial_names_raise():
    m = _model()
    named = list(m.named_parameters())
    with pytest.raises(ValueError, match="duplicates: 0.weight"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=named + [("0.weight", named[0][1])])
    with pytest.raises(ValueError, match="not named"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=named[:2])
    with pytest.raises(ValueError, match="tuples"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 backward_passes_per_step=0)


def test_zero_grad_between_backward_and_step_raises():
    m = _model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    _backward(m)
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()                                  # fine after step


def test_too_many_backward_passes_raise_and_accumulation_works():
    m = _model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   backward_passes_per_step=2)
    _backward(m, 2)
    with pytest.raises(AssertionError, match="backward_passes_per_step=2"):
        _backward(m)
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()


def test_parameter_without_gradient_gets_zeros():
    m = _model()
    extra = torch.nn.Parameter(torch.ones(2))
    opt = bps.DistributedOptimizer(torch.optim.SGD(list(m.parameters()) + [extra], lr=0.1))
    _backward(m)
    opt.step()
    assert extra.grad is not None and torch.equal(extra.grad, torch.zeros(2))


def test_lr_scheduler_made_before_wrapping_keeps_our_step():
    m = _model()
    base = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(base, step_size=1)
    opt = bps.DistributedOptimizer(base)
    _backward(m)
    opt.step()                                       # would leave handles if ours were skipped
    opt.zero_grad()


# ---------------------------------------------------------------- broadcast helpers
def test_broadcast_helpers_local():
    m = _model()
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    bps.broadcast_parameters(m.state_dict(), root_rank=0)
    bps.broadcast_parameters(m.named_parameters(), root_rank=0)
    assert all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
    with pytest.raises(ValueError, match="root_rank=1"):
        bps.broadcast_parameters(m.state_dict(), root_rank=1)
    with pytest.raises(TypeError, match="not a tensor"):
        bps.broadcast_parameters({"x": 3}, root_rank=0)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    bps.broadcast_optimizer_state(opt, root_rank=0)  # empty state is fine
    with pytest.raises(TypeError, match="Optimizer"):
        bps.broadcast_optimizer_state(m, root_rank=0)


def test_broadcast_object_roundtrip_and_errors():
    obj = {"t": (1, (2, "x")), 5: [np.arange(3.0), torch.ones(2, dtype=torch.bfloat16)],
           "f": np.int64(7), "b": b"\x01", "none": None}
    got = bps.broadcast_object(obj)
    assert got["t"] == (1, (2, "x")) and isinstance(got["t"][1], tuple)
    assert got[5][0].tolist() == [0.0, 1.0, 2.0] and got[5][1].dtype == torch.bfloat16
    assert got["f"] == 7 and got["f"].dtype == np.int64 and got["b"] == b"\x01"
    with pytest.raises(TypeError, match=r"obj\['a'\]\[1\] of type builtins.object"):
        bps.broadcast_object({"a": [1, object()]})
    assert bps.broadcast_object({"a": {2}, "b": frozenset({"x"})}) == \
        {"a": {2}, "b": frozenset({"x"})}           # sets, as Horovod's allgather_object
    with pytest.raises(TypeError, match="64 bits"):
        bps.broadcast_object([1 << 70])
    with pytest.raises(TypeError, match="dtype object"):
        bps.broadcast_object(np.array([None]))


def test_object_decoder_rejects_malformed_data():
    import msgpack
    good = _objects.encode({"a": np.arange(4)})
    with pytest.raises(ValueError):
        _objects.decode(good[:-3])
    bad_dtype = msgpack.packb(msgpack.ExtType(2, msgpack.packb(["|O", [1], b"\0" * 8])))
    with pytest.raises(ValueError, match="not allowed|bad dtype"):
        _objects.decode(bad_dtype)
    bad_len = msgpack.packb(msgpack.ExtType(2, msgpack.packb(["<f4", [3], b"\0" * 8])))
    with pytest.raises(ValueError, match="byte count"):
        _objects.decode(bad_len)
    with pytest.raises(ValueError, match="extension"):
        _objects.decode(msgpack.packb(msgpack.ExtType(5, msgpack.packb([0, "float32", [1]]))))
    with pytest.raises(ValueError, match="extension"):
        _objects.decode(msgpack.packb(msgpack.ExtType(42, b"")))


def test_ddp_wrapper_local():
    from byteps.torch.parallel import DistributedDataParallel
    m = _model()
    ddp = DistributedDataParallel(m)
    with ddp.no_sync():
        ddp(torch.randn(2, 3)).sum().backward()
    g = m[0].weight.grad.clone()
    ddp(torch.randn(2, 3)).sum().backward()
    assert not torch.equal(g, m[0].weight.grad)
    with pytest.raises(ValueError, match="one device"):
        DistributedDataParallel(m, device_ids=[0, 1])


def test_gradient_names_and_priorities_follow_parameter_order():
    m = _model()
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    params = list(m.parameters())
    assert [opt._bps_names[p] for p in params] == [n for n, _ in m.named_parameters()]
    prios = [opt._bps_priority[p] for p in params]
    assert prios == sorted(prios, reverse=True) and prios[0] == 0   # first layer goes first
    m2 = _model()
    unnamed = bps.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1))
    assert [unnamed._bps_names[p] for p in m2.parameters()] == [
        f"push_pull.noname.{i}" for i in range(len(params))]
    seen = []
    import byteps.torch.optimizer as mod
    orig = mod.push_pull_async_inplace

    def spy(t, average=True, name=None, version=0, priority=0):
        seen.append((name, priority))
        return orig(t, average, name, version, priority)
    mod.push_pull_async_inplace = spy
    try:
        _backward(m)
        opt.step()
    finally:
        mod.push_pull_async_inplace = orig
    assert max(seen, key=lambda s: s[1]) == ("Gradient.0.weight", 0)
    assert {n for n, _ in seen} == {"Gradient." + n for n, _ in m.named_parameters()}


def test_horovod_names_local():
    t = torch.arange(4.0)
    assert torch.equal(bps.allreduce(t, name="h.a"), t)
    assert torch.equal(bps.allreduce(t, op=bps.Sum, name="h.s", prescale_factor=2.0), 2 * t)
    x = t.clone()
    assert bps.allreduce_(x, name="h.in") is x
    assert torch.equal(bps.synchronize(bps.allreduce_async(t, name="h.async")), t)
    assert torch.equal(bps.broadcast(t, 0, name="h.b"), t)
    assert torch.equal(bps.allgather(torch.ones(2, 3), name="h.g"), torch.ones(2, 3))
    assert bps.allgather_object((1, "a")) == [(1, "a")]
    assert torch.equal(bps.allreduce(t, op=bps.Adasum, name="h.ada"), t)    # one rank
    for op in (bps.Min, bps.Max, bps.Product):        # element-wise on the servers
        assert torch.equal(bps.allreduce(t, op=op), t)
    with pytest.raises(ValueError, match="either"):
        bps.allreduce(t, average=True, op=bps.Sum)
    m = _model()
    with pytest.raises(ValueError, match="adasum-compression"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), op=bps.Adasum,
                                 compression=bps.Compression.fp16)
    with pytest.raises(ValueError, match="process_set"):
        bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), process_set=object())
    assert bps.cross_size() == 1 and bps.nccl_built() is False
    assert (bps.mpi_built(), bps.gloo_built(), bps.byteps_built()) == (False, False, True)

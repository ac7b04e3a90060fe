"""Horovod's collectives through ``import byteps.torch as hvd``, checked against numpy
references built from every rank's (deterministic) input.  Exits non-zero on a failure;
writes rank<r>.json with the checks it passed into argv[1]."""
import json
import sys
from pathlib import Path

import numpy as np
import torch

import byteps.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
done = []


def data(rank, shape, dtype=torch.float32):
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    return ((base % 7) + rank * 3 + 1).to(dtype)


def eq(a, b, what):
    if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16:
        assert b.dtype == torch.bfloat16, what
        a, b = a.float(), b.float()
    a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), \
        f"{what}: {a.dtype}{a.shape} {a.ravel()[:8]} != {b.dtype}{b.shape} {b.ravel()[:8]}"
    done.append(what)


def raises(fn, match, what):
    try:
        fn()
    except (RuntimeError, ValueError) as exc:
        assert all(m in str(exc) for m in match), f"{what}: {exc}"
        done.append(what)
        return
    raise AssertionError(f"{what}: no error")


# 1. build info
assert (hvd.mpi_built(), hvd.gloo_built(), hvd.mpi_enabled(), hvd.gloo_enabled(),
        hvd.ccl_built(), hvd.ddl_built(), hvd.byteps_built()) == (False,) * 6 + (True,)
assert hvd.nccl_built() is False and hvd.cuda_built() == torch.cuda.is_available()
done.append("build info")

# 2. allreduce with every op, dtypes kept
ins = {k: data(k, (3, 4)) for k in range(n)}
for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.uint8,
           torch.int8):
    x = {k: v.to(dt) for k, v in ins.items()}
    stack = torch.stack([x[k] for k in range(n)])
    eq(hvd.allreduce(x[r], op=hvd.Sum), stack.sum(0).to(dt), f"sum {dt}")
    eq(hvd.allreduce(x[r], op=hvd.Min), stack.min(0).values, f"min {dt}")
    eq(hvd.allreduce(x[r], op=hvd.Max), stack.max(0).values, f"max {dt}")
    if dt != torch.float16:
        eq(hvd.allreduce(x[r], op=hvd.Product), stack.prod(0).to(dt), f"product {dt}")
eq(hvd.allreduce(ins[r], op=hvd.Average), torch.stack(list(ins.values())).mean(0), "average")

# 3. prescale/postscale on integers keep the dtype (scaled in float64, truncated)
for dt in (torch.int32, torch.int64):
    x = ins[r].to(dt)
    pre = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.7)
    ref = sum((ins[k].to(dt).double() * 0.7).to(dt) for k in range(n))
    eq(pre, ref.to(dt), f"prescale {dt}")
    post = hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.3)
    eq(post, (sum(ins[k].to(dt) for k in range(n)).double() * 0.3).to(dt), f"postscale {dt}")

# 4. reducescatter: rows split as evenly as possible, first ranks one more
rows = 2 * n + 1
counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
start = sum(counts[:r])
xs = {k: data(k, (rows, 3)) for k in range(n)}
total = sum(xs.values())
eq(hvd.reducescatter(xs[r], op=hvd.Sum), total[start:start + counts[r]], "reducescatter sum")
eq(hvd.reducescatter(xs[r]), (total / n)[start:start + counts[r]], "reducescatter average")
h = hvd.reducescatter_async(xs[r].double(), op=hvd.Sum)
eq(hvd.synchronize(h), total.double()[start:start + counts[r]], "reducescatter async")
g = hvd.grouped_reducescatter([xs[r], xs[r][:n].to(torch.int64)], op=hvd.Sum)
eq(g[0], total[start:start + counts[r]], "grouped reducescatter 0")
eq(g[1], sum(xs[k][:n].to(torch.int64) for k in range(n))[r:r + 1], "grouped reducescatter 1")
t = xs[r].clone().requires_grad_()
hvd.reducescatter(t, op=hvd.Sum).backward(torch.ones(counts[r], 3))
eq(t.grad, torch.ones(rows, 3) * n, "reducescatter grad (Horovod's convention)")
eq(hvd.reducescatter(data(r, (n * 2,)), name="rs.same"), sum(data(k, (n * 2,))
   for k in range(n))[2 * r:2 * r + 2] / n, "reducescatter name 1st shape")
eq(hvd.reducescatter(data(r, (n,)), name="rs.same"), sum(data(k, (n,))
   for k in range(n))[r:r + 1] / n, "reducescatter name reused, new shape")

# 5. alltoall: equal and explicit splits (different per rank), autograd
x = data(r, (2 * n, 2))
out = hvd.alltoall(x)
eq(out, torch.cat([data(k, (2 * n, 2))[2 * r:2 * r + 2] for k in range(n)]), "alltoall equal")


def splits_of(k):                  # rank k sends (k + i) % 3 rows to rank i
    return [(k + i) % 3 for i in range(n)]


x = data(r, (sum(splits_of(r)), 2))
out, recv = hvd.alltoall(x, splits=torch.tensor(splits_of(r), dtype=torch.int32))
ref = []
for k in range(n):
    sk = splits_of(k)
    ref.append(data(k, (sum(sk), 2))[sum(sk[:r]):sum(sk[:r]) + sk[r]])
eq(out, torch.cat(ref), "alltoall splits")
eq(recv, torch.tensor([splits_of(k)[r] for k in range(n)], dtype=torch.int32), "received")
t = x.clone().requires_grad_()
o, _ = hvd.alltoall(t, splits=torch.tensor(splits_of(r)))
(o * 2).sum().backward()
eq(t.grad, torch.full_like(x, 2.0), "alltoall grad")

# 6. grouped allreduce / allgather (+ in place, async)
a, b = data(r, (3,)), data(r, (2, 2), torch.int64)
ga = hvd.grouped_allreduce([a, b], op=hvd.Sum)
eq(ga[0], sum(data(k, (3,)) for k in range(n)), "grouped allreduce 0")
eq(ga[1], sum(data(k, (2, 2), torch.int64) for k in range(n)), "grouped allreduce 1")
c = [a.clone(), b.clone()]
assert all(x is y for x, y in zip(hvd.grouped_allreduce_(c, op=hvd.Sum), c))
eq(c[1], ga[1], "grouped allreduce in place")
h = hvd.grouped_allreduce_async([a], op=hvd.Max)
eq(hvd.synchronize(h)[0], data(n - 1, (3,)), "grouped allreduce async")
gg = hvd.grouped_allgather([data(r, (r + 1, 2)), data(r, (1,), torch.int32)])
eq(gg[0], torch.cat([data(k, (k + 1, 2)) for k in range(n)]), "grouped allgather 0")
eq(gg[1], torch.cat([data(k, (1,), torch.int32) for k in range(n)]), "grouped allgather 1")

# 7. allgather / broadcast: async, differentiable, dtypes through casts
h = hvd.allgather_async(data(r, (r + 1, 3), torch.bfloat16))
eq(hvd.synchronize(h), torch.cat([data(k, (k + 1, 3), torch.bfloat16) for k in range(n)]),
   "allgather async bf16")
t = data(r, (r + 1, 2)).requires_grad_()
grads = torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)])
hvd.allgather(t).backward(grads)
eq(t.grad, torch.full((r + 1, 2), float(r)), "allgather grad")
root = n - 1
h = hvd.broadcast_async(data(r, (2, 3), torch.bool), root)
eq(hvd.synchronize(h), data(root, (2, 3), torch.bool), "broadcast async bool")
t = data(r, (4,)).requires_grad_()
hvd.broadcast(t, root).backward(torch.ones(4))
eq(t.grad, torch.ones(4) * (1.0 if r == root else 0.0), "broadcast grad")
x = data(r, (3,))
assert hvd.broadcast_(x, 0) is x
eq(x, data(0, (3,)), "broadcast_ in place")
eq(hvd.allgather(data(r, (1, 2)), name="ag.same"), torch.cat([data(k, (1, 2)) for k in range(n)]),
   "allgather name 1st shape")
eq(hvd.allgather(data(r, (2, 5)), name="ag.same"), torch.cat([data(k, (2, 5)) for k in range(n)]),
   "allgather name reused, new shape")

# 8. barrier, build-info style helpers, optimizer state
hvd.barrier()
done.append("barrier")
m = torch.nn.Linear(2, 2)
m.bias.requires_grad_(False)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_optimizer_state(opt, root_rank=0)
assert m.weight.grad is not None and m.bias.grad is None
done.append("broadcast_optimizer_state creates .grad")
dopt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                named_parameters=m.named_parameters())
assert dopt._parameter_names[m.weight] == "weight"
done.append("_parameter_names")

# 9. errors name ranks, never hang, and later collectives still work
last = n - 1
raises(lambda: hvd.allgather(data(r, (1, 2 if r == last else 3))),
       [f"rank {last}", "rank 0", "trailing dimensions"], "allgather shape error")
raises(lambda: hvd.allgather(data(r, (1,), torch.int32 if r == last else torch.float32)),
       [f"rank {last}", "dtype"], "allgather dtype error")
raises(lambda: hvd.broadcast(data(r, (2,)), r), ["rank 1", "root_rank"], "broadcast root error")
raises(lambda: hvd.broadcast(data(r, (2 + (r == last),)), 0), [f"rank {last}", "shape"],
       "broadcast shape error")
raises(lambda: hvd.reducescatter(data(r, (n + (r == last), 2))), [f"rank {last}", "shape"],
       "reducescatter shape error")
raises(lambda: hvd.reducescatter(data(r, (n,)), op=hvd.Sum if r == last else hvd.Average),
       [f"rank {last}", "op"], "reducescatter op error")
bad = [1] * n if r != last else [n + 5] + [0] * (n - 1)
raises(lambda: hvd.alltoall(data(r, (n, 2)), splits=torch.tensor(bad)),
       [f"rank {last}", "splits"], "alltoall splits error")
raises(lambda: hvd.allreduce(data(r, (2,)), name="opmix",
                             op=hvd.Min if r == last else hvd.Max), ["opmix", "op"],
       "allreduce op mismatch error")
raises(lambda: hvd.allreduce(data(r, (2 + (r == last),))), ["rank", "shape"],
       "allreduce shape error")
raises(lambda: hvd.allreduce(data(r, (2,), torch.int32), op=hvd.Adasum), ["Adasum", "int32"],
       "adasum of integers refused")
if r == 0:                          # as Horovod's test: the others push only later
    h = hvd.allreduce_async(data(r, (2,)), name="dup")
    try:
        hvd.allreduce_async(data(r, (2,)), name="dup")
        raise AssertionError("duplicate name: no error")
    except ValueError as exc:       # Horovod's type (also a BytePSError)
        assert "in flight" in str(exc) and isinstance(exc, hvd.BytePSError), exc
hvd.barrier()
if r != 0:
    h = hvd.allreduce_async(data(r, (2,)), name="dup")
eq(hvd.synchronize(h), sum(data(k, (2,)) for k in range(n)) / n, "duplicate name")
eq(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after"), torch.ones(3) * n,
   "collectives work after errors")

Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / f"rank{r}.json").write_text(json.dumps(done))
print(f"rank {r}: {len(done)} checks passed")

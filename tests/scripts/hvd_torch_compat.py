"""Horovod compatibility of byteps.torch beyond the collectives of torch_collectives.py:
names reused with new shapes, duplicate names, autograd of every collective, SyncBatchNorm,
sparse gradients, process sets (with 3 or more workers), errors that name ranks and leave
later collectives working.  Every check compares with a numpy/torch reference built from
every rank's deterministic input.  Writes rank<r>.json (the checks passed) into argv[1]."""
import json
import os
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
    return ((base % 5) + rank * 2 + 1).to(dtype)


def close(a, b, what, tol=1e-6):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol), \
        f"{what}: {a.shape} {a.ravel()[:6]} != {b.shape} {b.ravel()[:6]}"
    done.append(what)


def raises(fn, exc, match, what):
    try:
        fn()
    except exc as e:
        assert all(m in str(e) for m in match), f"{what}: {e}"
        done.append(what)
        return
    raise AssertionError(f"{what}: no error")


# 1. Horovod's launcher variables
assert os.environ["HOROVOD_RANK"] == str(r) and os.environ["HOROVOD_SIZE"] == str(n)
done.append("HOROVOD_RANK/SIZE")

# 2. a name used again with other shapes and dtypes (every rank changes at the same call)
for shape, dt in (((3,), torch.float32), ((2, 2), torch.float32), ((3,), torch.int32),
                  ((3,), torch.float32)):
    got = hvd.allreduce(data(r, shape, dt), name="reused", op=hvd.Sum)
    ref = sum(data(k, shape, dt) for k in range(n))
    assert got.dtype == dt
    close(got, ref, f"reused name {shape} {dt}")

# 3. a name in flight cannot be used again (ValueError on every rank at the same call)
t = data(r, (4,))
for kind, start in (("allreduce", lambda: hvd.allreduce_async(t, name="dup")),
                    ("allgather", lambda: hvd.allgather_async(t, name="dup")),
                    ("broadcast", lambda: hvd.broadcast_async(t, 0, name="dup"))):
    h = start()
    raises(start, ValueError, ["dup", "in flight"], f"duplicate {kind} name")
    hvd.synchronize(h)
h = hvd.allgather_async(t, name="dup")             # free again once synchronized
close(hvd.synchronize(h), torch.cat([data(k, (4,)) for k in range(n)]), "name free after sync")

# 4. prescale/postscale keep integer dtypes (scaled in float64, truncated)
x = data(r, (5,), torch.int32)
got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
ref = sum((data(k, (5,), torch.float64) * 0.5).to(torch.int32) for k in range(n))
assert got.dtype == torch.int32
close(got, (ref.to(torch.float64) * 3.0).to(torch.int32), "int prescale/postscale dtype")

# 5. autograd of allgather (summed gradient, own rows), broadcast (root gets the sum),
#    alltoall (gradient sent back), reducescatter (gathered gradient)
rows = [2 + k for k in range(n)]
x = data(r, (rows[r], 3), torch.float64).requires_grad_()
g = hvd.allgather(x)
w = torch.cat([torch.full((rows[k], 3), float(k + 1), dtype=torch.float64) for k in range(n)])
(g * w).sum().backward()
close(x.grad, torch.full((rows[r], 3), float(r + 1), dtype=torch.float64),
      "allgather grad")                  # averaged over the ranks, as Horovod >= 0.23
for root in range(n):
    x = data(r, (4,), torch.float64).requires_grad_()
    (hvd.broadcast(x, root) * 2).sum().backward()
    close(x.grad, torch.full((4,), 2.0 if r == root else 0.0, dtype=torch.float64),
          f"broadcast grad root {root}")
splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
x = data(r, (int(splits.sum()), 2), torch.float64).requires_grad_()
out, received = hvd.alltoall(x, splits)
assert received.tolist() == [r + 1] * n
(out * (r + 1)).sum().backward()
close(x.grad, torch.cat([torch.full((k + 1, 2), float(k + 1), dtype=torch.float64)
                         for k in range(n)]), "alltoall grad")
x = data(r, (2 * n + 1, 2), torch.float64).requires_grad_()
y = hvd.reducescatter(x, op=hvd.Sum)
start = sum(2 + (1 if k < 1 else 0) for k in range(r))
ref = sum(data(k, (2 * n + 1, 2), torch.float64) for k in range(n))
close(y, ref[start:start + y.shape[0]], "reducescatter rows")
y.sum().backward()
close(x.grad, torch.full((2 * n + 1, 2), float(n), dtype=torch.float64), "reducescatter grad")

# 6. SyncBatchNorm == BatchNorm over the concatenated batch (outputs, running stats, input
#    gradients, averaged weight gradients)
torch.manual_seed(0)
full = torch.randn(3 * n, 4, 5, dtype=torch.float32)
mine = full[3 * r:3 * r + 3].clone().requires_grad_()
sbn, bn = hvd.SyncBatchNorm(4), torch.nn.BatchNorm1d(4)
ys = sbn(mine)
ref_in = full.clone().requires_grad_()
yr = bn(ref_in)
close(ys, yr[3 * r:3 * r + 3], "SyncBatchNorm output", 1e-5)
close(sbn.running_mean, bn.running_mean, "SyncBatchNorm running_mean", 1e-5)
close(sbn.running_var, bn.running_var, "SyncBatchNorm running_var", 1e-5)
wgt = torch.arange(full.numel(), dtype=torch.float32).reshape(full.shape) % 3
(ys * wgt[3 * r:3 * r + 3]).sum().backward()
(yr * wgt).sum().backward()
close(mine.grad, ref_in.grad[3 * r:3 * r + 3], "SyncBatchNorm input grad", 1e-4)
close(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, "SyncBatchNorm weight grad",
      1e-4)
sbn.eval()
close(sbn(mine.detach()), bn.eval()(full)[3 * r:3 * r + 3], "SyncBatchNorm eval", 1e-5)

# 7. sparse allreduce and sparse embedding gradients through DistributedOptimizer
idx = torch.tensor([[r % 3, 4]])
sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0 + r, 2.0]), (6,))
got = hvd.synchronize(hvd.sparse_allreduce_async(sp, "sp", hvd.Sum))
assert got.is_sparse
close(got.to_dense(), sum(torch.sparse_coo_tensor(torch.tensor([[k % 3, 4]]),
                                                  torch.tensor([1.0 + k, 2.0]), (6,)).to_dense()
                          for k in range(n)), "sparse_allreduce_async")
torch.manual_seed(1)
emb = torch.nn.Embedding(10, 3, sparse=True)
hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
w0 = emb.weight.detach().clone()
opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                               named_parameters=emb.named_parameters())
ids = [torch.tensor([k, k + 1, 7]) for k in range(n)]
emb(ids[r]).sum().backward()
opt.step()
ref = w0.clone()
for k in range(n):
    for i in ids[k].tolist():
        ref[i] -= 0.5 / n
close(emb.weight, ref, "sparse embedding step")
assert opt._parameter_names[emb.weight] == "weight"

# 8. errors name both ranks, then the next collectives work
if n > 1:
    raises(lambda: hvd.allreduce(torch.zeros(3 + r), name="bad.shape"), RuntimeError,
           ["bad.shape", "rank"], "allreduce shape error")
    raises(lambda: hvd.allreduce(torch.zeros((2, 6) if r == 0 else (3, 4)), name="bad.dims"),
           RuntimeError, ["bad.dims"], "allreduce same-size shape error")
    raises(lambda: hvd.allgather(torch.zeros(2, 2 + r)), RuntimeError, ["rank 1", "rank 0"],
           "allgather shape error")
    raises(lambda: hvd.broadcast(torch.zeros(2), r), RuntimeError, ["root_rank"],
           "broadcast root error")
close(hvd.allreduce(data(r, (3,)), op=hvd.Sum), sum(data(k, (3,)) for k in range(n)),
      "collectives work after errors")

# 8b. join() at once while the others push names (and new layouts of a name) this rank
# never pushed: it adds zeros to them (with --local-size 2: in the host's local reduction)
for shape in ((4,), (2, 3)):
    if r == 0:
        hvd.join()
    else:
        got = hvd.allreduce(data(r, shape), name="join.new", op=hvd.Sum)
        close(got, sum(data(k, shape) for k in range(1, n)), f"join zeros {len(shape)}-d")
        hvd.join()

# 9. process sets: 2 of the ranks (the first and the last)
if n >= 3:
    members = [0, n - 1]
    ps = hvd.add_process_set(members)
    assert ps.process_set_id == 1 and ps.ranks == members and ps.size() == 2
    if ps.included():
        x = data(r, (3, 2))
        close(hvd.allreduce(x, op=hvd.Sum, process_set=ps), data(0, (3, 2)) +
              data(n - 1, (3, 2)), "set allreduce")
        close(hvd.allreduce(x, op=hvd.Max, process_set=ps), data(n - 1, (3, 2)), "set max")
        close(hvd.allgather(data(r, (1 + r, 2)), process_set=ps),
              torch.cat([data(k, (1 + k, 2)) for k in members]), "set allgather")
        close(hvd.broadcast(x, n - 1, process_set=ps), data(n - 1, (3, 2)), "set broadcast")
        rs = hvd.reducescatter(data(r, (3, 2)), op=hvd.Sum, process_set=ps)
        tot = data(0, (3, 2)) + data(n - 1, (3, 2))
        close(rs, tot[:2] if r == 0 else tot[2:], "set reducescatter")
        out, rec = hvd.alltoall(data(r, (3,)), torch.tensor([1, 2]), process_set=ps)
        me = members.index(r)
        ref = torch.cat([data(k, (3,))[:1] if me == 0 else data(k, (3,))[1:] for k in members])
        close(out, ref, "set alltoall")
        gs = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, process_set=ps)
        close(gs[1], 2 * (data(0, (3, 2)) + data(n - 1, (3, 2))), "set grouped_allreduce")
        hvd.barrier(process_set=ps)
        raises(lambda: hvd.allreduce(torch.zeros(2 + r), process_set=ps), RuntimeError,
               [f"rank {n - 1}", "rank 0"], "set shape error names global ranks")
        close(hvd.allreduce(x, op=hvd.Sum, process_set=ps), tot, "set works after error")
        xg = data(r, (2,), torch.float64).requires_grad_()
        hvd.allgather(xg, process_set=ps).sum().backward()
        close(xg.grad, torch.full((2,), 1.0, dtype=torch.float64), "set allgather grad")
        model = torch.nn.Linear(2, 1)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0, process_set=ps)
        sopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters(),
                                        process_set=ps)
        model(data(r, (4, 2))).sum().backward()
        sopt.step()
        ws = hvd.allgather(model.weight.detach(), process_set=ps)
        close(ws[0], ws[1], "set optimizer keeps members equal")
        assert hvd.allgather_object({"r": r}, process_set=ps) == [{"r": k} for k in members]
        done.append("set allgather_object")
    else:
        raises(lambda: hvd.allreduce(torch.zeros(2), process_set=ps), ValueError,
               ["not a member"], "non-member refused")
    # unnamed global calls after set calls still meet (counters are per set)
    close(hvd.allreduce(data(r, (2,)), op=hvd.Sum), sum(data(k, (2,)) for k in range(n)),
          "global after set ops")
    raises(lambda: hvd.add_process_set([0, 1] if r == 0 else [1, 2]), RuntimeError,
           ["add_process_set", "rank"], "add_process_set disagreement")
    assert hvd.remove_process_set(ps) and not hvd.remove_process_set(ps)
    done.append("remove_process_set")

hvd.barrier()
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(done))

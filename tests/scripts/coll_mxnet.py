"""Horovod's MXNet collectives through byteps.mxnet on mx.nd arrays, checked against numpy
references built from every rank's deterministic input.  Exits non-zero on a failure;
writes rank<r>.json with the checks it passed into argv[1]."""
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

import byteps.mxnet as bps

bps.init()
r, n = bps.rank(), bps.size()
done = []


def data(rank, shape, dtype=np.float32):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return ((base % 7) + rank * 3 + 1).astype(dtype)


def nd(a):
    return mx.nd.array(a, dtype=a.dtype)


def eq(a, b, what):
    assert isinstance(a, mx.nd.NDArray), f"{what}: got {type(a).__name__}"
    a, b = a.asnumpy(), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), \
        f"{what}: {a.dtype}{a.shape} {a.ravel()[:8]} != {b.dtype}{b.shape} {b.ravel()[:8]}"
    done.append(what)


def raises(fn, match, what):
    try:
        fn()
    except (bps.BytePSError, ValueError) as exc:
        assert all(m in str(exc) for m in match), f"{what}: {exc}"
        done.append(what)
        return
    raise AssertionError(f"{what}: no error")


assert (bps.mpi_built(), bps.gloo_built(), bps.nccl_built(), bps.byteps_built()) == \
    (False, False, False, True)
done.append("build info")

for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8):
    x = {k: data(k, (3, 2), dt) for k in range(n)}
    stack = np.stack([x[k] for k in range(n)])
    eq(bps.allreduce(nd(x[r]), op=bps.Sum), stack.sum(0).astype(dt), f"sum {np.dtype(dt)}")
    eq(bps.allreduce(nd(x[r]), op=bps.Max), stack.max(0), f"max {np.dtype(dt)}")
    eq(bps.allreduce(nd(x[r]), op=bps.Min), stack.min(0), f"min {np.dtype(dt)}")
f = data(r, (4,))
eq(bps.allreduce(nd(f)), np.mean([data(k, (4,)) for k in range(n)], 0).astype(np.float32),
   "average")
t = nd(f)
bps.allreduce_(t, op=bps.Product)
eq(t, np.prod([data(k, (4,)) for k in range(n)], 0).astype(np.float32), "allreduce_ product")
eq(bps.allreduce(nd(np.array([7, -7], np.int32)), op=bps.Sum, prescale_factor=0.5),
   np.array([3 * n, -3 * n], np.int32), "prescale int32")
g = bps.grouped_allreduce([nd(f), nd(2 * f)], op=bps.Sum)
eq(g[1], 2 * sum(data(k, (4,)) for k in range(n)), "grouped_allreduce")
ts = [nd(f), nd(f)]
bps.grouped_allreduce_(ts, op=bps.Max)
eq(ts[0], data(n - 1, (4,)), "grouped_allreduce_")

eq(bps.allgather(nd(data(r, (r + 1, 2), np.int64))),
   np.concatenate([data(k, (k + 1, 2), np.int64) for k in range(n)]), "allgather")
ga = bps.grouped_allgather([nd(data(r, (1,))), nd(data(r, (r + 2,), np.uint8))])
eq(ga[1], np.concatenate([data(k, (k + 2,), np.uint8) for k in range(n)]), "grouped_allgather")

for root in range(n):
    eq(bps.broadcast(nd(data(r, (2, 2))), root), data(root, (2, 2)), f"broadcast from {root}")
b = nd(data(r, (3,), np.int32))
bps.broadcast_(b, n - 1)
eq(b, data(n - 1, (3,), np.int32), "broadcast_")

rows = 2 * n + 1
x = {k: data(k, (rows, 2)) for k in range(n)}
total = sum(x.values())
base, extra = divmod(rows, n)
start, cnt = r * base + min(r, extra), base + (1 if r < extra else 0)
eq(bps.reducescatter(nd(x[r]), op=bps.Sum), total[start:start + cnt], "reducescatter sum")
eq(bps.grouped_reducescatter([nd(x[r])])[0], total[start:start + cnt] / np.float32(n),
   "grouped_reducescatter average")

eq(bps.alltoall(nd(np.arange(2 * n, dtype=np.float32) + 10 * r)),
   np.concatenate([np.arange(2 * r, 2 * r + 2, dtype=np.float32) + 10 * k for k in range(n)]),
   "alltoall equal")
splits = [k + r + 1 for k in range(n)]
send = np.concatenate([np.full((k + r + 1, 2), 10 * r + k, np.int32) for k in range(n)])
out, received = bps.alltoall(nd(send), splits=mx.nd.array(splits, dtype=np.int32))
eq(received, np.array([r + j + 1 for j in range(n)], np.int32), "alltoall received splits")
eq(out, np.concatenate([np.full((r + j + 1, 2), 10 * j + r, np.int32) for j in range(n)]),
   "alltoall splits")

raises(lambda: bps.allgather(nd(np.ones((2, r + 1), np.float32))), ["rank 1", "trailing"],
       "allgather shape error")
raises(lambda: bps.broadcast(nd(np.ones(3, np.float32)), r), ["root_rank", "rank 1"],
       "broadcast root error")
raises(lambda: bps.alltoall(nd(np.ones(n + 1, np.float32))), ["divide"],
       "alltoall equal split error")
raises(lambda: bps.allreduce(nd(np.ones(2, np.float32)), process_set=object()),
       ["process_set"], "process set refused")
eq(bps.allreduce(nd(np.ones(2, np.float32)), op=bps.Sum), np.full(2, n, np.float32),
   "collectives work after errors")

Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(done))
print(f"rank {r}: {len(done)} checks passed")

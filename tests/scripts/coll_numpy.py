"""Horovod's collectives through byteps.numpy, checked against numpy references built from
every rank's (deterministic) input.  Exits non-zero on a failure; writes rank<r>.json with
the checks it passed into argv[1]."""
import json
import sys
from pathlib import Path

import numpy as np

import byteps.numpy as bps

bps.init()
r, n = bps.rank(), bps.size()
done = []
DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8, np.int16,
          np.uint16, np.uint32)


def data(rank, shape, dtype=np.float32):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return ((base % 7) + rank * 3 + 1).astype(dtype)


def eq(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), \
        f"{what}: {a.dtype}{a.shape} {a.ravel()[:8]} != {b.dtype}{b.shape} {b.ravel()[:8]}"
    done.append(what)


def raises(fn, match, what, kinds=(bps.BytePSError, ValueError)):
    try:
        fn()
    except kinds as exc:
        assert all(m in str(exc) for m in match), f"{what}: {exc}"
        done.append(what)
        return
    raise AssertionError(f"{what}: no error")


# build info
assert (bps.mpi_built(), bps.gloo_built(), bps.mpi_enabled(), bps.gloo_enabled(),
        bps.ccl_built(), bps.ddl_built(), bps.nccl_built(), bps.cuda_built(),
        bps.byteps_built()) == (False,) * 8 + (True,)
assert (bps.cross_size(), bps.is_homogeneous()) == (n // bps.local_size(), True)
done.append("build info")

# allreduce: every op and dtype (the dtype and shape are kept)
for dt in DTYPES:
    x = {k: data(k, (3, 4), dt) for k in range(n)}
    stack = np.stack([x[k] for k in range(n)])
    eq(bps.allreduce(x[r], op=bps.Sum), stack.sum(0).astype(dt), f"sum {np.dtype(dt)}")
    eq(bps.allreduce(x[r], op=bps.Min), stack.min(0), f"min {np.dtype(dt)}")
    eq(bps.allreduce(x[r], op=bps.Max), stack.max(0), f"max {np.dtype(dt)}")
    if dt != np.float16:
        eq(bps.allreduce(x[r], op=bps.Product), stack.prod(0).astype(dt),
           f"product {np.dtype(dt)}")
f = data(r, (5,), np.float64)
eq(bps.allreduce(f), np.mean([data(k, (5,), np.float64) for k in range(n)], 0), "average")
eq(bps.allreduce(np.float32(r + 1), op=bps.Sum), np.float32(n * (n + 1) / 2), "scalar")
i = np.array([7, -7, 3], np.int32) * (r + 1)
want = sum((np.array([7, -7, 3], np.float64) * (k + 1) * 0.5).astype(np.int32)
           for k in range(n)) * 3 // 1
eq(bps.allreduce(i, op=bps.Sum, prescale_factor=0.5, postscale_factor=3.0),
   (want.astype(np.float64) * 3.0 / 3.0).astype(np.int32), "prescale/postscale int32")
# float16 averaged or postscaled: the sum rounded to float16, then divided or scaled in
# float32 and rounded (Horovod's CPU arithmetic, test_tensorflow.py's reference; with 3
# ranks, rounding only once differs for some of these values)
x16 = np.random.default_rng(1234).uniform(-100, 100, 64).astype(np.float16)
s16 = (x16.astype(np.float32) * n).astype(np.float16).astype(np.float32)
eq(bps.allreduce(x16, op=bps.Sum, postscale_factor=0.6172),
   (s16 * np.float32(0.6172)).astype(np.float16), "postscale float16")
eq(bps.allreduce(x16), (s16 / n).astype(np.float16), "average float16")
eq(bps.reducescatter(np.tile(x16, (n, 1))), (s16 / n).astype(np.float16)[None],
   "reducescatter avg float16")
h = bps.allreduce_async(f, op=bps.Sum, name="async.sum")
assert isinstance(bps.poll(h), bool)
eq(bps.synchronize(h), sum(data(k, (5,), np.float64) for k in range(n)), "allreduce_async")

# grouped allreduce
g = bps.grouped_allreduce([data(r, (2,), np.int32), data(r, (3, 1))], op=bps.Max)
eq(g[0], data(n - 1, (2,), np.int32), "grouped_allreduce[0]")
eq(g[1], data(n - 1, (3, 1)), "grouped_allreduce[1]")

# allgather with a first dimension that differs by rank, every dtype (bool too)
for dt in DTYPES + (np.bool_,):
    mine = (data(r, (r + 1, 2)) % 2 if dt is np.bool_ else data(r, (r + 1, 2))).astype(dt)
    want = np.concatenate([(data(k, (k + 1, 2)) % 2 if dt is np.bool_ else
                            data(k, (k + 1, 2))).astype(dt) for k in range(n)])
    eq(bps.allgather(mine), want, f"allgather {np.dtype(dt)}")
ga = bps.synchronize(bps.grouped_allgather_async([np.full(r + 1, r, np.int64),
                                                  np.ones((1, 3), np.float16) * r]))
eq(ga[0], np.concatenate([np.full(k + 1, k, np.int64) for k in range(n)]), "grouped_allgather")
eq(ga[1], np.concatenate([np.ones((1, 3), np.float16) * k for k in range(n)]),
   "grouped_allgather[1]")

# broadcast from every root, every dtype, a complex one too
for root in range(n):
    for dt in DTYPES + (np.bool_, np.complex64):
        eq(bps.broadcast(data(r, (2, 3)).astype(dt), root), data(root, (2, 3)).astype(dt),
           f"broadcast {np.dtype(dt)} from {root}")
eq(bps.synchronize(bps.broadcast_async(np.array(r, np.int64), n - 1)), np.array(n - 1),
   "broadcast_async scalar")

# reducescatter: uneven rows (the first n % size ranks get one more)
rows = 2 * n + 1
x = {k: data(k, (rows, 2)) for k in range(n)}
total = sum(x.values())
base, extra = divmod(rows, n)
start = r * base + min(r, extra)
cnt = base + (1 if r < extra else 0)
eq(bps.reducescatter(x[r], op=bps.Sum), total[start:start + cnt], "reducescatter sum")
eq(bps.reducescatter(x[r]), total[start:start + cnt] / np.float32(n), "reducescatter average")
rs = bps.grouped_reducescatter([x[r], x[r][:, :1].astype(np.int32)], op=bps.Sum)
eq(rs[1], total[start:start + cnt, :1].astype(np.int32), "grouped_reducescatter")

# alltoall: equal parts and explicit splits (rank j sends k + j + 1 rows to rank k)
eq(bps.alltoall(np.arange(n * 2) + 100 * r),
   np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * k for k in range(n)]),
   "alltoall equal")
splits = [k + r + 1 for k in range(n)]
send = np.concatenate([np.full((k + r + 1, 2), 10 * r + k, np.int16) for k in range(n)])
out, received = bps.alltoall(send, splits=splits)
eq(received, np.array([r + j + 1 for j in range(n)]), "alltoall received splits")
eq(out, np.concatenate([np.full((r + j + 1, 2), 10 * j + r, np.int16) for j in range(n)]),
   "alltoall splits")

# empty tensors: nothing to exchange, nothing waits
eq(bps.alltoall(np.zeros((n, 0), np.float32)), np.zeros((n, 0), np.float32), "alltoall empty")
eq(bps.allgather(np.zeros((0, 3), np.int32)), np.zeros((0, 3), np.int32), "allgather empty")
eq(bps.allgather(np.zeros((r % 2, 3), np.int32)), np.zeros((n // 2, 3), np.int32),
   "allgather some empty")

# objects (msgpack, never pickle)
got = bps.broadcast_object({"hello": 123, 0: [1, 2], "a": np.arange(3) * r} if r == n - 1
                           else None, root_rank=n - 1)
assert got["hello"] == 123 and got[0] == [1, 2] and got["a"].tolist() == [0, n - 1, 2 * n - 2]
done.append("broadcast_object")
assert bps.allgather_object({"r": r, "x": [r] * r}) == [{"r": k, "x": [k] * k}
                                                        for k in range(n)]
done.append("allgather_object")
raises(lambda: bps.broadcast_object(object() if r == 0 else None, 0), ["rank 0"],
       "broadcast_object unencodable", (bps.BytePSError, TypeError))

# a process set of 2 of 3 ranks (where the core has process sets): passed through
if n >= 3 and hasattr(bps, "add_process_set"):
    ps = bps.add_process_set([0, 2])
    if r in (0, 2):
        eq(bps.allreduce(np.full(3, r, np.int16), op=bps.Sum, process_set=ps),
           np.full(3, 2, np.int16), "set allreduce int16")
        eq(bps.allgather(np.full((r + 1, 2), r, np.float32), process_set=ps),
           np.concatenate([np.zeros((1, 2), np.float32), np.full((3, 2), 2, np.float32)]),
           "set allgather")
        eq(bps.broadcast(np.array([r, r], np.int64), 2, process_set=ps), np.array([2, 2]),
           "set broadcast")
        eq(bps.alltoall(np.array([r, r + 10]), process_set=ps), np.array([0, 2]) +
           (0 if r == 0 else 10), "set alltoall")
    bps.remove_process_set(ps)

# errors: every rank gets the same error naming the ranks; nothing hangs
raises(lambda: bps.allgather(np.ones((2, r + 1))), ["rank 1", "rank 0", "trailing"],
       "allgather shape error")
raises(lambda: bps.allgather(np.ones(2, np.float32 if r else np.int32)), ["dtype", "rank 1"],
       "allgather dtype error")
raises(lambda: bps.broadcast(np.ones(3), r), ["root_rank", "rank 1"], "broadcast root error")
raises(lambda: bps.broadcast(np.ones(3 + r), 0), ["shape", "rank 1"], "broadcast shape error")
raises(lambda: bps.alltoall(np.ones(n), splits=[n - 1] + [0] * (n - 1) if r == 1 else None),
       ["rank 1", "splits"], "alltoall splits error")
raises(lambda: bps.alltoall(np.ones(n + 1)), ["divide"], "alltoall equal split error")
raises(lambda: bps.reducescatter(np.ones((2, 2 + r))), ["rank 1"], "reducescatter shape error")
raises(lambda: bps.allreduce(np.ones(2, np.int32), op=bps.Adasum), ["Adasum", "int32"],
       "adasum of integers refused")
raises(lambda: bps.allreduce(np.ones(2), process_set=object()), ["process_set"],
       "process set refused")
raises(lambda: bps.allreduce(np.ones(3 + r), name="mismatch"), ["mismatch"],
       "allreduce shape error")
eq(bps.allreduce(np.ones(3), op=bps.Sum), np.full(3, float(n)), "collectives work after errors")
bps.barrier()
done.append("barrier")

Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(done))
print(f"rank {r}: {len(done)} checks passed")
bps.shutdown()

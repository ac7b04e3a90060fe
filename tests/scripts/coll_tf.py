"""Horovod's collectives through byteps.tensorflow (eager, tf.function, a TF1 graph) and
byteps.keras, checked against numpy references built from every rank's deterministic
input; gradients against their closed forms.  Exits non-zero on a failure; writes
rank<r>.json with the checks it passed into argv[1]."""
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import byteps.keras as bk
import byteps.tensorflow as hvd
import byteps.tensorflow.keras as tk

hvd.init()
r, n = hvd.rank(), hvd.size()
done = []


def data(rank, shape, dtype=np.float32):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return ((base % 7) + rank * 3 + 1).astype(dtype)


def eq(a, b, what):
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    b = b.numpy() if hasattr(b, "numpy") else np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), \
        f"{what}: {a.dtype}{a.shape} {a.ravel()[:8]} != {b.dtype}{b.shape} {b.ravel()[:8]}"
    done.append(what)


def raises(fn, kinds, match, what):
    try:
        fn()
    except kinds as exc:
        assert all(m in str(exc) for m in match), f"{what}: {type(exc).__name__}: {exc}"
        done.append(what)
        return
    raise AssertionError(f"{what}: no error")


# build info, Horovod's names
assert (hvd.mpi_built(), hvd.gloo_built(), hvd.mpi_enabled(), hvd.gloo_enabled(),
        hvd.ccl_built(), hvd.ddl_built(), hvd.nccl_built(), hvd.byteps_built()) == \
    (False,) * 7 + (True,)
assert hvd.cuda_built() == tf.test.is_built_with_cuda()
assert int(hvd.rank_op()) == r and int(hvd.size_op()) == n and hvd.cross_size() == n
for name in ("allreduce", "allgather", "broadcast", "reducescatter", "mpi_built", "Average",
             "Sum", "cuda_built", "byteps_built"):
    assert getattr(bk, name) is not None and getattr(tk, name) is not None, name
done.append("build info")

# allreduce, every op and dtype (dtype and shape kept), eager
for dt in (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8,
           tf.int8, tf.int16, tf.uint16):
    npdt = dt.as_numpy_dtype
    x = {k: data(k, (3, 4)).astype(npdt) for k in range(n)}
    stack = np.stack([x[k] for k in range(n)])
    t = tf.constant(x[r], dt)
    eq(hvd.allreduce(t, op=hvd.Sum), stack.astype(np.float64).sum(0).astype(npdt),
       f"sum {dt.name}")
    eq(hvd.allreduce(t, op=hvd.Min), stack.min(0), f"min {dt.name}")
    eq(hvd.allreduce(t, op=hvd.Max), stack.max(0), f"max {dt.name}")
eq(hvd.allreduce(tf.constant(float(r + 1))), np.float32((n + 1) / 2), "average scalar")
eq(hvd.allreduce(tf.constant([2, 3], tf.int64) * (r + 1), op=hvd.Product),
   np.array([2 ** n, 3 ** n]) * np.prod(np.arange(1, n + 1)), "product int64")
eq(hvd.allreduce(tf.constant([7, -7], tf.int32), op=hvd.Sum, prescale_factor=0.5,
                 postscale_factor=2.0), np.array([6 * n, -6 * n], np.int32),
   "prescale/postscale int32")
eq(hvd.push_pull(tf.ones([2]) * r, average=False), np.full(2, n * (n - 1) / 2, np.float32),
   "push_pull (the original name)")

# inside tf.function
@tf.function
def fn_ops(x):
    return (hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Max), hvd.allgather(x),
            hvd.broadcast(x, n - 1), hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum),
            hvd.reducescatter(x, op=hvd.Sum), hvd.alltoall(x))


xs = {k: data(k, (n, 2)) for k in range(n)}
for step in range(2):                   # the second call reuses the traced names
    s, mx, ag, bc, grp, rs, a2a = fn_ops(tf.constant(xs[r]))
    total = sum(xs.values())
    eq(s, total, "function sum")
    eq(mx, np.max(np.stack(list(xs.values())), 0), "function max")
    eq(ag, np.concatenate([xs[k] for k in range(n)]), "function allgather")
    eq(bc, xs[n - 1], "function broadcast")
    eq(grp[1], 2 * total, "function grouped_allreduce")
    eq(rs, total[r:r + 1], "function reducescatter")
    eq(a2a, np.concatenate([xs[k][r:r + 1] for k in range(n)]), "function alltoall")

# IndexedSlices: gathered (values and indices), divided by the size for Average
sl = tf.IndexedSlices(tf.fill([r + 1, 2], float(r + 1)), tf.constant([r] * (r + 1)),
                      tf.constant([n, 2]))
got = hvd.allreduce(sl)
eq(got.values, np.concatenate([np.full((k + 1, 2), (k + 1) / n, np.float32)
                               for k in range(n)]), "IndexedSlices average values")
eq(got.indices, np.concatenate([[k] * (k + 1) for k in range(n)]).astype(np.int32),
   "IndexedSlices indices")

# allgather (first dimension differs by rank), every copy dtype
for dt in (tf.float32, tf.float16, tf.bfloat16, tf.int16, tf.uint16, tf.uint32, tf.bool,
           tf.complex64, tf.int8):
    mine = data(r, (r + 1, 2)) % 2 if dt == tf.bool else data(r, (r + 1, 2))
    want = np.concatenate([(data(k, (k + 1, 2)) % 2 if dt == tf.bool else
                            data(k, (k + 1, 2))).astype(dt.as_numpy_dtype)
                           for k in range(n)])
    eq(hvd.allgather(tf.cast(mine, dt)), want, f"allgather {dt.name}")
g = hvd.grouped_allgather([tf.fill([r + 1], r), tf.ones([1, 3]) * r])
eq(g[0], np.concatenate([[k] * (k + 1) for k in range(n)]).astype(np.int32),
   "grouped_allgather")

# broadcast from every root
for root in range(n):
    for dt in (tf.float64, tf.int32, tf.bool, tf.uint8):
        eq(hvd.broadcast(tf.cast(data(r, (2, 3)) % 2, dt), root),
           (data(root, (2, 3)) % 2).astype(dt.as_numpy_dtype), f"broadcast {dt.name} {root}")
v = tf.Variable(tf.ones([3]) * r)
hvd.broadcast_([v], 0)
eq(v, np.zeros(3, np.float32), "broadcast_ variables")

# reducescatter with uneven rows, grouped
rows = 2 * n + 1
x = {k: data(k, (rows, 2)) for k in range(n)}
total = sum(x.values())
base, extra = divmod(rows, n)
start, cnt = r * base + min(r, extra), base + (1 if r < extra else 0)
eq(hvd.reducescatter(tf.constant(x[r]), op=hvd.Sum), total[start:start + cnt],
   "reducescatter sum")
eq(hvd.reducescatter(tf.constant(x[r])), total[start:start + cnt] / np.float32(n),
   "reducescatter average")
eq(hvd.grouped_reducescatter([tf.constant(x[r]), tf.constant(x[r])], op=hvd.Sum)[1],
   total[start:start + cnt], "grouped_reducescatter")

# alltoall with explicit splits: returns (received rows, received splits)
splits = [k + r + 1 for k in range(n)]
send = np.concatenate([np.full((k + r + 1, 2), 10 * r + k, np.int16) for k in range(n)])
out, received = hvd.alltoall(tf.constant(send), splits=tf.constant(splits))
eq(received, np.array([r + j + 1 for j in range(n)], np.int32), "alltoall received splits")
eq(out, np.concatenate([np.full((r + j + 1, 2), 10 * j + r, np.int16) for j in range(n)]),
   "alltoall splits")

# gradients (Horovod's: same op for allreduce, averages for allgather/broadcast)
w = tf.Variable(data(r, (r + 1, 2)))
w2 = tf.Variable(data(r, (2, 2)))
with tf.GradientTape(persistent=True) as tape:
    s = hvd.allreduce(w2, op=hvd.Sum)
    ag = hvd.allgather(w)
    bc = hvd.broadcast(w[:1], 0)
    up = tf.constant(np.arange(n * (n + 1) // 2 * 2, dtype=np.float32).reshape(-1, 2))
    loss_ag = tf.reduce_sum(ag * up)
eq(tape.gradient(s, w2), np.full((2, 2), n, np.float32), "grad allreduce sum")
off = r * (r + 1) // 2
eq(tape.gradient(loss_ag, w), up.numpy()[off:off + r + 1], "grad allgather")
eq(tape.gradient(bc, w), np.concatenate([np.full((1, 2), 1.0 if r == 0 else 0.0),
                                         np.zeros((r, 2))]).astype(np.float32),
   "grad broadcast")
z = tf.Variable(data(r, (rows, 2)))
with tf.GradientTape() as tape:
    part = hvd.reducescatter(z, op=hvd.Sum)
    loss = tf.reduce_sum(part * (r + 1))
eq(tape.gradient(loss, z), np.concatenate([np.full((base + (1 if k < extra else 0), 2),
                                                   (k + 1) * n, np.float32)
                                           for k in range(n)]), "grad reducescatter")
a = tf.Variable(tf.constant(send, tf.float32))
with tf.GradientTape() as tape:
    out, _ = hvd.alltoall(a, splits=splits)
    loss = tf.reduce_sum(out * tf.cast(tf.range(tf.shape(out)[0])[:, None], tf.float32))
gw = tape.gradient(loss, a).numpy()
assert gw.shape == send.shape
done.append("grad alltoall shape")

# a gradient inside tf.function
@tf.function
def fn_grad(w):
    with tf.GradientTape() as tape:
        tape.watch(w)
        y = hvd.allgather(w)
    return tape.gradient(y, w)


eq(fn_grad(tf.ones([2, 2])), np.ones((2, 2), np.float32), "function grad allgather")

# a TF1 graph: ops built first, run by a session (twice), tf.gradients
with tf.Graph().as_default():
    p = tf.constant(data(r, (2, 2)))
    s = hvd.allreduce(p, op=hvd.Sum)
    ag = hvd.allgather(p)
    grad = tf.gradients(s, p)[0]
    with tf.compat.v1.Session() as sess:
        for _ in range(2):
            sv, agv, gv = sess.run([s, ag, grad])
eq(sv, sum(data(k, (2, 2)) for k in range(n)), "graph sum")
eq(agv, np.concatenate([data(k, (2, 2)) for k in range(n)]), "graph allgather")
eq(gv, np.full((2, 2), n, np.float32), "graph grad")

# keras: Horovod's module-level helpers
eq(bk.allreduce(np.ones(2) * r, average=False), np.full(2, n * (n - 1) / 2), "keras allreduce")
eq(bk.allgather(np.full((1, 2), r)), np.repeat(np.arange(n), 2).reshape(n, 2),
   "keras allgather")
eq(bk.broadcast(np.array([r, r]), 1), np.array([1, 1]), "keras broadcast")
eq(bk.reducescatter(np.ones((n, 2), np.float32), op=hvd.Sum), np.full((1, 2), n, np.float32),
   "keras reducescatter")

# a process set of 2 of 3 ranks (where the core has process sets)
if n >= 3 and hasattr(hvd, "add_process_set"):
    ps = hvd.add_process_set([0, 2])
    if r in (0, 2):
        me = 0 if r == 0 else 1
        eq(hvd.allreduce(tf.constant([r, 1]), op=hvd.Sum, process_set=ps),
           np.array([2, 2], np.int32), "set allreduce")
        w = tf.Variable(tf.ones([r + 1, 2]) * (r + 1))
        with tf.GradientTape() as tape:
            y = hvd.allgather(w, process_set=ps)
            loss = tf.reduce_sum(y * tf.range(4.0)[:, None])
        eq(tape.gradient(loss, w), np.repeat(np.arange(4.0, dtype=np.float32), 2)
           .reshape(4, 2)[[0] if me == 0 else [1, 2, 3]], "set grad allgather")
        eq(hvd.alltoall(tf.constant([r, r + 10]), process_set=ps),
           np.array([0, 2], np.int32) + (0 if me == 0 else 10), "set alltoall")
    hvd.remove_process_set(ps)

# objects (msgpack, never pickle)
assert hvd.broadcast_object({"hello": 123, 0: [1, 2]} if r == 0 else {}, root_rank=0) == \
    {"hello": 123, 0: [1, 2]}
assert hvd.allgather_object({"m": r}) == [{"m": k} for k in range(n)]
done.append("objects")

# errors: every rank gets the same error naming the ranks; nothing hangs
FP = tf.errors.FailedPreconditionError
raises(lambda: hvd.allgather(tf.ones([2, r + 1])), (FP, hvd.BytePSError),
       ["rank 1", "rank 0", "trailing dimensions"], "allgather shape error")
raises(lambda: hvd.broadcast(tf.ones(3), r), FP, ["root_rank", "rank 1"],
       "broadcast root error")
raises(lambda: hvd.alltoall(tf.ones(n, tf.int32 if r else tf.float32)), FP, ["dtype"],
       "alltoall dtype error")
raises(lambda: hvd.alltoall(tf.ones(n + 1)), tf.errors.InvalidArgumentError, ["divide"],
       "alltoall equal split error")
raises(lambda: hvd.alltoall(tf.ones(n), splits=[n - 1] + [0] * (n - 1) if r == 1 else None),
       (FP, tf.errors.InvalidArgumentError), ["rank 1", "splits"], "alltoall splits error")
raises(lambda: hvd.allreduce(tf.ones([3 + r]), name="mismatch"), FP, ["mismatch"],
       "allreduce shape error")
raises(lambda: tf.function(lambda t: hvd.allgather(t))(tf.ones([2, r + 1])),
       tf.errors.OpError, ["rank 1", "trailing dimensions"], "function allgather shape error")
raises(lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum), ValueError,
       ["Adasum", "int32"], "adasum of integers refused")
raises(lambda: hvd.reducescatter(tf.ones(2), op=hvd.Max), ValueError, ["Average or Sum"],
       "reducescatter max refused")
raises(lambda: hvd.allgather(tf.ones(2), process_set=object()), ValueError, ["process_set"],
       "process set refused")
eq(hvd.allreduce(tf.ones(3), op=hvd.Sum), np.full(3, float(n), np.float32),
   "collectives work after errors")
last = hvd.join()                        # the core's join: an int in every plugin
assert isinstance(last, int) and 0 <= last < n, last
done.append("join")

Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(done))
print(f"rank {r}: {len(done)} checks passed")

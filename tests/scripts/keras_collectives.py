"""Worker for tests/test_keras_collectives.py: every collective of byteps.tensorflow through
both Keras front ends (byteps.keras and byteps.tensorflow.keras, generated from
byteps/_keras): alltoall, grouped allreduce/allgather/reducescatter, barrier, process sets,
broadcast_object, allgather_object, join, checked against numpy references.
argv = out_dir.  Writes rank<r>.json with the checks passed, per front end."""
import json
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

import byteps.keras as bk
import byteps.tensorflow.keras as tk

bk.init()
r, n = bk.rank(), bk.size()
done: dict = {}


def eq(a, b, what, fe):
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    b = np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), \
        f"{fe} {what}: {a.dtype}{a.shape} {a.ravel()[:8]} != {b.dtype}{b.shape} {b.ravel()[:8]}"
    done[fe].append(what)


for fe, m in (("keras", bk), ("tensorflow.keras", tk)):
    done[fe] = []
    assert m.size() == n and m.rank() == r
    # alltoall: rank r sends row k to rank k; equal parts, then explicit splits
    eq(m.alltoall(np.array([10 * r + k for k in range(n)], np.int32)),
       np.array([10 * k + r for k in range(n)], np.int32), "alltoall", fe)
    rows, splits = m.alltoall(np.arange(3, dtype=np.float32) + 100 * r,
                              splits=[1, 2] if n == 2 else None)
    eq(rows, np.array([100.0 * k + (0 if r == 0 else 1 + j) for k in range(n)
                       for j in range(1 if r == 0 else 2)], np.float32), "alltoall splits",
       fe)
    eq(splits, np.array([1 if r == 0 else 2] * n, np.int32), "alltoall received splits", fe)
    # grouped forms: one operation for a list
    g = m.grouped_allreduce([np.ones(2, np.float32) * (r + 1), np.full(3, r, np.int32)],
                            average=False)
    eq(g[0], np.full(2, n * (n + 1) / 2, np.float32), "grouped_allreduce sum", fe)
    eq(g[1], np.full(3, n * (n - 1) // 2, np.int32), "grouped_allreduce int", fe)
    ga = m.grouped_allreduce([np.ones(2, np.float32) * r], op=m.Average)
    eq(ga[0], np.full(2, (n - 1) / 2, np.float32), "grouped_allreduce average", fe)
    gg = m.grouped_allgather([np.full((1, 2), r, np.float32), np.full((r + 1,), r, np.int64)])
    eq(gg[0], np.repeat(np.arange(n, dtype=np.float32), 2).reshape(n, 2),
       "grouped_allgather", fe)
    eq(gg[1], np.concatenate([np.full(k + 1, k, np.int64) for k in range(n)]),
       "grouped_allgather ragged", fe)
    gs = m.grouped_reducescatter([np.ones((n, 2), np.float32) * (r + 1),
                                  np.ones((2 * n,), np.float32)], op=m.Sum)
    eq(gs[0], np.full((1, 2), n * (n + 1) / 2, np.float32), "grouped_reducescatter", fe)
    eq(gs[1], np.full((2,), float(n), np.float32), "grouped_reducescatter 1d", fe)
    # the collectives of Horovod's keras with process_set= (global set given explicitly)
    eq(m.allreduce(np.ones(2) * r, average=False, process_set=m.global_process_set),
       np.full(2, n * (n - 1) / 2), "allreduce global set", fe)
    eq(m.broadcast(np.array([r, r]), 1, process_set=m.global_process_set), np.array([1, 1]),
       "broadcast global set", fe)
    # barrier: rank 0 arrives late; nobody leaves before it arrives
    if r == 0:
        time.sleep(0.5)
    t0 = m.allgather_object(time.time())
    m.barrier()
    assert time.time() >= max(t0) - 1e-3
    done[fe].append("barrier")
    # process sets: a set of rank 1 only (every rank registers it)
    ps = m.add_process_set([n - 1])
    assert isinstance(ps, m.ProcessSet) and ps.included() == (r == n - 1)
    if r == n - 1:
        eq(m.allreduce(np.array([r, 1], np.int32), op=m.Sum, process_set=ps),
           np.array([r, 1], np.int32), "set allreduce", fe)
        eq(m.allgather(np.array([r], np.int32), process_set=ps), np.array([r], np.int32),
           "set allgather", fe)
        eq(m.grouped_allreduce([np.ones(2, np.float32)], process_set=ps)[0],
           np.ones(2, np.float32), "set grouped_allreduce", fe)
        eq(m.alltoall(np.array([7], np.int32), process_set=ps), np.array([7], np.int32),
           "set alltoall", fe)
        m.barrier(process_set=ps)
        done[fe].append("set barrier")
    assert m.remove_process_set(ps)
    done[fe].append("process sets")
    # objects
    assert m.broadcast_object({"x": [1, 2]} if r == 0 else None, root_rank=0) == {"x": [1, 2]}
    assert m.allgather_object({"r": r}) == [{"r": k} for k in range(n)]
    done[fe].append("objects")

last = tk.join()
assert isinstance(last, int) and 0 <= last < n
done["tensorflow.keras"].append("join")
# inside a TF1 graph the Keras helpers return values (Horovod's keras)
with tf.Graph().as_default():
    with tf.compat.v1.Session():
        out = tk.grouped_allreduce([np.ones(2, np.float32)], average=False)
        assert isinstance(out[0], np.ndarray) and out[0].tolist() == [float(n)] * 2, out
        done["tensorflow.keras"].append("graph grouped_allreduce")
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(done))
bk.shutdown()

"""Horovod's collectives for TensorFlow, over :mod:`byteps.core.collective.ops`.

Every rule (op resolution, scaling, naming, agreement between ranks, row layouts) is the
core's; this module converts tensors (:mod:`byteps.tensorflow._plumbing`) and registers
gradients with ``tf.custom_gradient``, as Horovod registers them for its ops:

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: the gradient is averaged over the ranks, and each rank keeps its own rows;
* broadcast: the gradient is averaged over the ranks on the root and zero elsewhere
  (allgather and broadcast as Horovod >= 0.23 and byteps.torch);
* reducescatter: the gradient (times the size for Sum, times the scale factors) is
  allgathered;
* alltoall: the gradient goes back with the received splits.

The operations work eagerly, inside ``tf.function`` and in TF1 graphs.  Unnamed calls get
a name from the core's counter when they are built (``tf.function`` and graphs: once, at
tracing), so every rank must build its unnamed operations in the same order.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from byteps.core import api as core
from byteps.core.collective import ops as coll
from byteps.core.collective.rules import check_unscaled
from byteps.core.api import basics as _basics  # noqa: F401  (hvd.mpi_ops._basics, Horovod's)
from byteps.core.api.basics import process_set_kw
from byteps.tensorflow import _plumbing as P
from byteps.tensorflow.compression import Compression

Average, Sum, Adasum = coll.AVERAGE, coll.SUM, coll.ADASUM
Min, Max, Product = coll.MIN, coll.MAX, coll.PRODUCT
ReduceOp = coll.ReduceOp

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum", "allgather",
           "allreduce", "alltoall", "broadcast", "broadcast_", "grouped_allgather",
           "grouped_allreduce", "grouped_reducescatter", "local_rank_op",
           "local_size_op", "process_set_included_op", "rank_op", "reducescatter",
           "size_op"]


def _op(average, op, kind: str = "allreduce"):
    """Horovod's ``average``/``op`` -> an op for the core (validated now, by the core's
    rule for ``kind``)."""
    coll.resolve_op(average, op, kind)
    if op is None:
        return Average if average is None or average else Sum
    return op


def _name(name, kind: str, kw: dict) -> str:
    """``name``, or one from the core's counter (per process set) now, when built."""
    return coll.check_name(name, kind, kw.get("process_set"))


def _members(kw: dict) -> tuple[int, int]:
    """(size, this worker's index) of the process set in ``kw`` (default: every worker)."""
    ps = kw.get("process_set")
    return (core.size(), core.rank()) if ps is None else (ps.size(), ps.rank())


def _tensor(t, what: str):
    if isinstance(t, tf.IndexedSlices) or isinstance(t, tf.SparseTensor):
        raise TypeError(f"{what}: sparse tensors are not supported here; convert them with "
                        f"tf.convert_to_tensor first")
    return tf.convert_to_tensor(t)


# ------------------------------------------------------------------ allreduce
def _allreduce_dense(t, name, op, pre, post, kw):
    wired, dt = P.to_wire(t, copy=False)

    @tf.custom_gradient
    def fn(x):
        def np_fn(a):
            return [coll.allreduce(a, name, op=op, prescale_factor=pre,
                                   postscale_factor=post, **kw)]
        (y,) = P.run(np_fn, [x], [(x.dtype, x.shape)], "Allreduce")

        def grad(dy):
            return _allreduce_dense(dy, coll.auto_name("allreduce.grad", **kw), op, pre, post,
                                    kw)
        return y, grad
    return P.from_wire(fn(wired), dt)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """Reduce ``tensor`` over every worker (default: average; ``op`` Sum, Average, Min, Max
    or Product; prescale/postscale keep the dtype).  A ``tf.IndexedSlices`` is allgathered
    (values and indices; divided by the size for Average), as Horovod does.
    Differentiable."""
    kw = process_set_kw(process_set, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        (out,) = _sparse_allreduce([tensor], average, device_sparse, compression, op,
                                   prescale_factor, postscale_factor, name, process_set,
                                   "allreduce")
        return out
    op = _op(average, op, "allreduce")
    name = _name(name, "allreduce", kw)
    tensor = _tensor(tensor, "allreduce")
    with tf.device(device_dense):
        c, ctx = compression.compress(tensor)
        out = _allreduce_dense(c, name, op, float(prescale_factor), float(postscale_factor),
                               kw)
        return compression.decompress(out, ctx)


_SPARSE = "allreduce of tf.IndexedSlices"


def _sparse_allreduce(slices, average, device, compression, op, pre, post, name, process_set,
                      kind):
    """Allreduce of ``tf.IndexedSlices``, as Horovod: the values and the indices of every
    rank are allgathered (one grouped allgather each); Average divides the values by the
    number of ranks (``/``: integers become floats, as Horovod's).  Only Sum and Average,
    without scale factors (NotImplementedError, the core's rules)."""
    op = _op(average, op, _SPARSE)
    check_unscaled(_SPARSE, pre, post)
    kw = process_set_kw(process_set, kind)
    base = _name(name, kind, kw)
    with tf.device(device):
        pairs = [compression.compress(s.values) for s in slices]
        values = grouped_allgather([v for v, _ in pairs], name=base + ".values",
                                   process_set=process_set)
        indices = grouped_allgather([s.indices for s in slices], name=base + ".indices",
                                    process_set=process_set)
        out = []
        for s, v, (_, ctx), i in zip(slices, values, pairs, indices):
            v = compression.decompress(v, ctx)
            if coll.resolve_op(None, op) == (0, True):        # Average
                v = v / tf.cast(_members(kw)[0], v.dtype)
            out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
        return out


def _grouped_dense(tensors, name, op, pre, post, kw):
    pairs = [P.to_wire(t, copy=False) for t in tensors]

    @tf.custom_gradient
    def fn(*xs):
        def np_fn(*arrays):
            return coll.grouped_allreduce(list(arrays), name, op=op, prescale_factor=pre,
                                          postscale_factor=post, **kw)
        ys = P.run(np_fn, list(xs), [(x.dtype, x.shape) for x in xs], "GroupedAllreduce")

        def grad(*dys):
            return _grouped_dense(list(dys), coll.auto_name("grouped_allreduce.grad", **kw),
                                  op, pre, post, kw)
        return ys, grad
    if not tensors:
        return []
    outs = fn(*[w for w, _ in pairs])
    return [P.from_wire(o, d) for o, (_, d) in zip(outs, pairs)]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, ignore_name_scope=False,
                      name=None):
    """Reduce every tensor of ``tensors`` in one operation (a list); differentiable."""
    kw = process_set_kw(process_set, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return tensors
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i in range(len(tensors)) if i not in set(sparse)]
    out = [None] * len(tensors)
    if sparse:        # as Horovod: grouped allgathers of their values and indices
        for i, r in zip(sparse, _sparse_allreduce(
                [tensors[i] for i in sparse], average, device_sparse, compression, op,
                prescale_factor, postscale_factor, None, process_set, "grouped_allreduce")):
            out[i] = r
    if dense:
        op = _op(average, op)
        gname = _name(name, "grouped_allreduce", kw)
        ts = [_tensor(tensors[i], "grouped_allreduce") for i in dense]
        with tf.device(device_dense):
            pairs = [compression.compress(t) for t in ts]
            outs = _grouped_dense([c for c, _ in pairs], gname, op, float(prescale_factor),
                                  float(postscale_factor), kw)
            for i, o, (_, ctx) in zip(dense, outs, pairs):
                out[i] = compression.decompress(o, ctx)
    return out


# ------------------------------------------------------------------ allgather
def _own_rows(grad, x, process_set):
    """Average ``grad`` over the ranks and keep this rank's rows (allgather's gradient)."""
    n, me = _members(process_set_kw(process_set, "allgather"))
    g = allreduce(grad, op=Average, process_set=process_set)
    dims = allgather(tf.reshape(tf.shape(x)[0], [1]), process_set=process_set)
    parts = tf.split(g, tf.reshape(dims, [n]), num=n, axis=0)
    return parts[me]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenate every worker's ``tensor`` along the first dimension (which may differ
    between workers; the other dimensions and the dtype must agree).  Differentiable."""
    kw = process_set_kw(process_set, "allgather")
    tensor = _tensor(tensor, "allgather")
    name = _name(name, "allgather", kw)
    wired, dt = P.to_wire(tensor, copy=True)

    @tf.custom_gradient
    def fn(x):
        shape = tf.TensorShape([None]).concatenate(x.shape[1:]) \
            if x.shape.rank is not None else x.shape
        (y,) = P.run(lambda a: [coll.allgather(a, name, **kw)], [x], [(x.dtype, shape)],
                     "Allgather")

        def grad(dy):
            return _own_rows(dy, x, process_set)
        return y, grad
    return P.from_wire(fn(wired), dt)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """Allgather every tensor of ``tensors`` in one operation (a list); differentiable."""
    kw = process_set_kw(process_set, "grouped_allgather")
    tensors = [_tensor(t, "grouped_allgather") for t in tensors]
    if not tensors:
        return []
    name = _name(name, "grouped_allgather", kw)
    pairs = [P.to_wire(t, copy=True) for t in tensors]

    @tf.custom_gradient
    def fn(*xs):
        specs = [(x.dtype, tf.TensorShape([None]).concatenate(x.shape[1:])
                  if x.shape.rank is not None else x.shape) for x in xs]
        ys = P.run(lambda *arrays: coll.grouped_allgather(list(arrays), name, **kw), list(xs),
                   specs, "GroupedAllgather")

        def grad(*dys):
            return [_own_rows(dy, x, process_set) for dy, x in zip(dys, xs)]
        return ys, grad
    outs = fn(*[w for w, _ in pairs])
    return [P.from_wire(o, d) for o, (_, d) in zip(outs, pairs)]


# ------------------------------------------------------------------ broadcast
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None,
              scope: str = "", is_variable: bool = True):
    """Rank ``root_rank``'s ``tensor`` on every worker (every worker must pass the same
    root rank, shape and dtype; else every worker gets an error naming both ranks).
    Differentiable.  ``scope`` and ``is_variable`` are the original BytePS arguments."""
    kw = process_set_kw(process_set, "broadcast")
    root = coll.check_root(root_rank, "broadcast", kw.get("process_set"))
    tensor = _tensor(tensor, "broadcast")
    name = _name((scope.rstrip("/") + "/" + name) if scope and name else name, "broadcast", kw)
    wired, dt = P.to_wire(tensor, copy=True)

    @tf.custom_gradient
    def fn(x):
        def np_fn(a):
            return [coll.broadcast(a, root, name, **kw)]
        (y,) = P.run(np_fn, [x], [(x.dtype, x.shape)], "Broadcast")

        def grad(dy):
            g = allreduce(dy, op=Average, process_set=process_set)
            return g if core.rank() == root else g * 0
        return y, grad
    return P.from_wire(fn(wired), dt)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """Overwrite every variable with rank ``root_rank``'s value; returns the variables
    (eager) or the assign ops (graph)."""
    base = _name(name, "broadcast_", process_set_kw(process_set, "broadcast_"))
    out = [v.assign(broadcast(v, root_rank, name=f"{base}.{i}", process_set=process_set))
           for i, v in enumerate(variables)]
    return variables if P.eager() else out


# ------------------------------------------------------------------ reducescatter
def _scatter_grad(dy, op, pre, post, process_set):
    n = _members(process_set_kw(process_set, "reducescatter"))[0]
    factor = pre * post * (n if coll.resolve_op(None, op) == (0, False) else 1)
    if factor != 1.0:
        dy = dy * tf.cast(factor, dy.dtype)
    return allgather(dy, process_set=process_set)


def _reducescatter(tensors, name, op, pre, post, kind, process_set):
    kw = process_set_kw(process_set, "reducescatter")
    pairs = [P.to_wire(t, copy=False) for t in tensors]

    @tf.custom_gradient
    def fn(*xs):
        specs = [(x.dtype, tf.TensorShape([None]).concatenate(x.shape[1:])
                  if x.shape.rank is not None else x.shape) for x in xs]
        ys = P.run(lambda *arrays: coll.grouped_reducescatter(
            list(arrays), name, op=op, prescale_factor=pre, postscale_factor=post, **kw),
            list(xs), specs, kind)

        def grad(*dys):
            return [_scatter_grad(dy, op, pre, post, process_set) for dy in dys]
        return ys, grad
    outs = fn(*[w for w, _ in pairs])
    return [P.from_wire(o, d) for o, (_, d) in zip(outs, pairs)]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average,
                  name=None, process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over every worker (Average or Sum) and return this worker's block
    of rows (the first ``n % size`` workers get one row more).  Differentiable."""
    kw = process_set_kw(process_set, "reducescatter")
    op = _op(None, op, "reducescatter")
    name = _name(name, "reducescatter", kw)
    tensor = _tensor(tensor, "reducescatter")
    with tf.device(device_dense):
        c, ctx = compression.compress(tensor)
        (out,) = _reducescatter([c], name, op, float(prescale_factor),
                                float(postscale_factor), "Reducescatter", process_set)
        return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0,
                          name=None):
    """Reducescatter every tensor of ``tensors`` in one operation (a list)."""
    kw = process_set_kw(process_set, "grouped_reducescatter")
    op = _op(None, op, "grouped_reducescatter")
    name = _name(name, "grouped_reducescatter", kw)
    tensors = [_tensor(t, "grouped_reducescatter") for t in tensors]
    if not tensors:
        return []
    with tf.device(device_dense):
        pairs = [compression.compress(t) for t in tensors]
        outs = _reducescatter([c for c, _ in pairs], name, op, float(prescale_factor),
                              float(postscale_factor), "GroupedReducescatter", process_set)
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ------------------------------------------------------------------ alltoall
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Send ``splits[i]`` rows of ``tensor`` to worker ``i`` (equal parts without
    ``splits``); returns the rows received, by sending rank, and, when ``splits`` is
    given, the received splits (int32), as Horovod.  Differentiable."""
    kw = process_set_kw(process_set, "alltoall")
    tensor = _tensor(tensor, "alltoall")
    name = _name(name, "alltoall", kw)
    wired, dt = P.to_wire(tensor, copy=True)
    n = _members(kw)[0]
    split_t = None if splits is None else tf.cast(tf.reshape(tf.convert_to_tensor(splits),
                                                             [-1]), tf.int64)

    def np_fn(a, s=None):
        out, received = coll.alltoall(a, None if s is None else s, name, **kw)
        return [out, np.asarray(received, np.int32)]

    @tf.custom_gradient
    def fn(x):
        shape = tf.TensorShape([None]).concatenate(x.shape[1:]) \
            if x.shape.rank is not None else x.shape
        ins = [x] if split_t is None else [x, split_t]
        y, received = P.run(np_fn, ins, [(x.dtype, shape), (tf.int32, tf.TensorShape([n]))],
                            "Alltoall")

        def grad(dy, _=None):
            g, _ = alltoall(dy, splits=received, process_set=process_set)
            return g
        return (y, received), grad
    y, received = fn(wired)
    y = P.from_wire(y, dt)
    return y if splits is None else (y, received)


# ------------------------------------------------------------------ the rest
def _const(value: int, name):
    return tf.constant(value, dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name=None):
    """The number of workers, as an int32 tensor."""
    if process_set_id:
        from byteps.core.collective.process_sets import get_process_set
        return _const(get_process_set(process_set_id).size(), name)
    return _const(core.size(), name)


def local_size_op(name=None):
    """The number of workers on this host, as an int32 tensor."""
    return _const(core.local_size(), name)


def rank_op(name=None):
    """This worker's rank, as an int32 tensor."""
    return _const(core.rank(), name)


def local_rank_op(name=None):
    """This worker's rank on its host, as an int32 tensor."""
    return _const(core.local_rank(), name)


def process_set_included_op(process_set_id: int = 0, name=None):
    """1 when this worker is in the process set ``process_set_id`` (0: the global set)."""
    if process_set_id:
        from byteps.core.collective.process_sets import get_process_set
        return _const(int(get_process_set(process_set_id).included()), name)
    return _const(1, name)


# Horovod's mpi_ops also binds the basic queries (``from horovod.tensorflow.mpi_ops import
# rank, size``): byteps.tensorflow's own, looked up on use (that package imports this module)
_BASICS = frozenset({
    "init", "shutdown", "is_initialized", "rank", "local_rank", "size", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "join", "start_timeline", "stop_timeline",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet",
    "add_process_set", "remove_process_set", "global_process_set"})


def __getattr__(name: str):
    if name in _BASICS:
        import byteps.tensorflow as plugin
        return getattr(plugin, name)
    raise AttributeError(f"module 'byteps.tensorflow.mpi_ops' has no attribute {name!r}")

"""TensorFlow side of the exchanges: eager calls or ``tf.numpy_function`` ops.

Each gradient's push_pull is *started* by its own op as soon as the
gradient exists; one op per step then waits for all of them.  Start ops are
created last-layer-first: ``tf.function`` runs stateful ops in creation
order, and that is the order in which backpropagation produces gradients.
"""
from __future__ import annotations

import re
import zlib

import numpy as np
import tensorflow as tf

from byteps.core import api as core
from byteps.core.collective.rules import sum_or_average
from byteps.tensorflow import _exchange
from byteps.tensorflow._plumbing import from_wire, graph_fn, to_wire

Average, Sum, Adasum = "Average", "Sum", "Adasum"


def resolve_op(op, average, kind: str = "DistributedOptimizer") -> str:
    """``op`` (Average/Sum) from the old ``average=`` flag or the new ``op=`` (the core's
    rule, :func:`byteps.core.collective.rules.sum_or_average`)."""
    return Average if sum_or_average(average, op, kind) else Sum


def var_name(v, i: int) -> str:
    """A rank-independent name for variable/tensor ``v`` (position ``i`` as a fallback)."""
    name = getattr(v, "path", None)
    if not isinstance(name, str) or not name:
        try:
            name = v.name
        except (AttributeError, ValueError):   # eager tensors have no name
            name = None
    if not isinstance(name, str) or not name:
        return f"tensor{i}"
    return re.sub(r":0$", "", name)


def unique_names(prefix: str, sources) -> list[str]:
    """``prefix + name`` for every source; repeated names get ``.1``, ``.2``... suffixes."""
    seen: dict[str, int] = {}
    out = []
    for i, v in enumerate(sources):
        n = prefix + var_name(v, i)
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else f"{n}.{k}")
    return out


def eager() -> bool:
    return tf.executing_eagerly()


def start_dense(t, name: str, average: bool, priority: int = 0, shape_in_name=False):
    if eager():
        return _exchange.start_dense(t.numpy(), name, average, priority, shape_in_name)

    def fn(x):
        return np.int64(_exchange.start_dense(x, name, average, priority, shape_in_name))
    out = tf.numpy_function(graph_fn(fn), [t], tf.int64, stateful=True,
                            name="BytePSPushPull")
    out.set_shape([])
    return out


def start_sparse(values, indices, name: str, average: bool, priority: int = 0):
    if eager():
        return _exchange.start_sparse(values.numpy(), indices.numpy(), name, average, priority)

    def fn(v, i):
        return np.int64(_exchange.start_sparse(v, i, name, average, priority))
    out = tf.numpy_function(graph_fn(fn), [values, indices], tf.int64, stateful=True,
                            name="BytePSSparsePushPull")
    out.set_shape([])
    return out


def wait(tickets: list, specs: list, step: bool = False) -> list:
    """Finish the exchanges; ``specs`` holds one (dtype, shape) per result tensor.
    ``step``: they are a step's gradients (the step ends for the timeline)."""
    if not tickets:
        return []
    fn = _exchange.wait_step if step else _exchange.wait
    if eager():
        return [tf.convert_to_tensor(a) for a in fn(*tickets)]
    outs = tf.numpy_function(graph_fn(fn), list(tickets), [d for d, _ in specs],
                             stateful=True, name="BytePSWait")
    for o, (_, shape) in zip(outs, specs):
        o.set_shape(shape)
    return list(outs)


def push_pull_grads(grads: list, sources: list, prefix: str, compression, sparse_as_dense: bool,
                    op: str, device_dense: str = "", device_sparse: str = "",
                    step: bool = True, process_set=None) -> list:
    """Average (or sum) a flat list of gradients across workers; ``None`` stays ``None``.
    ``step``: they are one training step's gradients (the step ends when they are in).
    ``process_set`` (Horovod's): only among that set's ranks (:func:`_set_grads`)."""
    if process_set is not None and getattr(process_set, "process_set_id", None) != 0:
        return _set_grads(grads, sources, prefix, compression, sparse_as_dense, op,
                          device_dense, device_sparse, process_set)
    if core.size() == 1:
        return [tf.convert_to_tensor(g) if sparse_as_dense and isinstance(g, tf.IndexedSlices)
                else g for g in grads]
    if len(grads) != len(sources):
        raise ValueError(f"{prefix}: {len(grads)} gradients for {len(sources)} variables")
    names = unique_names(prefix, sources)
    average = op == Average
    compression, cparams = _split_compression(compression)
    plan, tickets, specs = {}, [], []
    for i in reversed(range(len(grads))):       # last layers' gradients exist first
        g = grads[i]
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
            g = tf.convert_to_tensor(g)
        sparse = isinstance(g, tf.IndexedSlices)
        with tf.device(device_sparse if sparse else device_dense):
            c, ctx = compression.compress(g.values if sparse else g)
            c, wdt = to_wire(c, copy=False)
            if sparse:
                tickets.append(start_sparse(c, g.indices, names[i], average, -i))
                specs += [(c.dtype, tf.TensorShape([None]).concatenate(c.shape[1:])),
                          (tf.int64, tf.TensorShape([None]))]
            else:
                if cparams:
                    core.declare(names[i], compression_params=cparams)
                tickets.append(start_dense(c, names[i], average, -i))
                specs.append((c.dtype, c.shape))
        plan[i] = (g, sparse, ctx, wdt)
    results = iter(wait(tickets, specs, step=step))
    out = list(grads)
    for i in reversed(range(len(grads))):
        if i not in plan:
            continue
        g, sparse, ctx, wdt = plan[i]
        with tf.device(device_sparse if sparse else device_dense):
            r = compression.decompress(from_wire(next(results), wdt), ctx)
            if sparse:
                idx = tf.cast(next(results), g.indices.dtype)
                out[i] = tf.IndexedSlices(r, idx, g.dense_shape)
            else:
                out[i] = r
    return out


def _split_compression(compression):
    """``(compression the plugin applies, compression_params the core applies)``: with core
    parameters (byteps.compression) the plugin applies none."""
    cparams = getattr(compression, "core_params", None)
    if cparams:
        from byteps.tensorflow.compression import NoneCompressor
        return NoneCompressor, cparams
    return compression, None


def gradient_process_set(process_set):
    """``process_set=`` of a gradient wrapper: None for None or the global set (every
    worker: the servers' path), else the set, which must be registered (ValueError)."""
    from byteps.core.api.basics import process_set_kw
    return process_set_kw(process_set, "process_set").get("process_set")


def reducing_size(process_set) -> int:
    """The number of ranks whose gradients are averaged: the set's, or every worker's."""
    return core.size() if process_set is None else process_set.size()


def _set_grads(grads, sources, prefix, compression, sparse_as_dense, op, device_dense,
               device_sparse, ps) -> list:
    """The gradients of a process set, as Horovod's ``process_set=``: averaged (or summed)
    among the set's ranks only, each by the set's allreduce over the worker-to-worker links
    (byteps.core.collective.set_ops; compressed there too with ``compression_params``); a
    rank outside the set keeps its own gradients and sends nothing."""
    from byteps.core.api.basics import process_set_kw
    from byteps.tensorflow import mpi_ops
    process_set_kw(ps, prefix)                      # registered (ValueError when built)
    dense = [tf.convert_to_tensor(g) if sparse_as_dense and isinstance(g, tf.IndexedSlices)
             else g for g in grads]
    if not ps.included():
        return dense
    if len(grads) != len(sources):
        raise ValueError(f"{prefix}: {len(grads)} gradients for {len(sources)} variables")
    names = unique_names(prefix, sources)
    compression, cparams = _split_compression(compression)
    out = list(dense)
    for i, g in enumerate(dense):
        if g is None:
            continue
        if cparams and not isinstance(g, tf.IndexedSlices):
            core.declare(names[i], compression_params=cparams)
        out[i] = mpi_ops.allreduce(g, op=mpi_ops.Average if op == Average else mpi_ops.Sum,
                                   name=names[i], process_set=ps, compression=compression,
                                   device_dense=device_dense, device_sparse=device_sparse)
    return out


def broadcast_tensors(tensors: list, names: list[str], root_rank: int) -> list:
    """Rank ``root_rank``'s value of every tensor, on every rank (one check, one wait)."""
    if not tensors:
        return []
    wired = [to_wire(tf.convert_to_tensor(t)) for t in tensors]

    def run(*arrays):
        check_same("broadcast names", names)
        return _exchange.wait(*[_exchange.start_broadcast(a, n, root_rank)
                                for a, n in zip(arrays, names)])
    if eager():
        res = [tf.convert_to_tensor(a) for a in run(*[w.numpy() for w, _ in wired])]
    else:
        res = tf.numpy_function(graph_fn(run), [w for w, _ in wired],
                                [w.dtype for w, _ in wired],
                                stateful=True, name="BytePSBroadcast")
        for r, (w, _) in zip(res, wired):
            r.set_shape(w.shape)
    return [from_wire(r, d) for r, (_, d) in zip(res, wired)]


def check_same(what: str, names: list[str]) -> None:
    """Raise a clear error (instead of hanging) when ranks disagree on a list of names."""
    if core.size() == 1:
        return
    h = zlib.crc32("\0".join(names).encode())
    mine = np.array([len(names), h], np.int64)
    tot = core.push_pull(mine, f"byteps.check.{what}", average=False)
    if tot[0] != mine[0] * core.size() or tot[1] != mine[1] * core.size():
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise core.BytePSError(
            f"rank {core.rank()}: the ranks disagree on the {what}: this rank has "
            f"{len(names)} ({shown}) but the sum over {core.size()} ranks is {int(tot[0])} "
            f"names; build the same model/metrics on every rank before this call")

"""Horovod's MXNet collectives on ``mx.nd`` arrays, over :mod:`byteps.numpy.collectives`
(the core's rules; dtypes the servers do not carry converted exactly).

Inputs are read into host numpy arrays (``asnumpy``) and results come back as NDArrays on
the input's context, in the input's dtype; the ``*_`` forms write into their inputs.  Every
operation takes ``process_set=`` (only the global set) and ``priority`` (accepted; the
operations run one at a time).  Without ``name`` the core numbers the call, so every
rank must make its unnamed calls in the same order.
"""
from __future__ import annotations

import numpy as np

from byteps.mxnet._mx import mx
from byteps.mxnet.ops import check_dense
from byteps.numpy import collectives as _np_coll

Average, Sum, Adasum = _np_coll.Average, _np_coll.Sum, _np_coll.Adasum
Min, Max, Product = _np_coll.Min, _np_coll.Max, _np_coll.Product
broadcast_object, allgather_object = _np_coll.broadcast_object, _np_coll.allgather_object
ReduceOp = _np_coll.ReduceOp

__all__ = ["Adasum", "allgather", "allgather_object", "allreduce", "allreduce_", "alltoall",
           "Average", "broadcast", "broadcast_", "broadcast_object", "grouped_allgather",
           "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "Max", "Min",
           "Product", "ReduceOp", "reducescatter", "Sum"]


def _host(t, what: str) -> np.ndarray:
    return check_dense(t, what).asnumpy()


def _nd(a: np.ndarray, like):
    return mx.nd.array(a, ctx=like.context, dtype=a.dtype)


def _write(t, a: np.ndarray):
    t[:] = mx.nd.array(a.reshape(t.shape), ctx=t.context, dtype=t.dtype)
    return t


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None, op=None):
    """Reduce ``tensor`` over every worker (default: average; ``op`` Sum, Average, Min, Max
    or Product); returns a new NDArray of the same dtype."""
    a = _host(tensor, "allreduce")
    return _nd(_np_coll.allreduce(a, average, name, op, prescale_factor, postscale_factor,
                                  process_set), tensor)


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, op=None):
    """In-place :func:`allreduce`; returns ``tensor``."""
    a = _host(tensor, "allreduce_")
    return _write(tensor, _np_coll.allreduce(a, average, name, op, prescale_factor,
                                             postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, op=None) -> list:
    """Reduce every NDArray of ``tensors`` in one operation; returns new NDArrays."""
    tensors = list(tensors)
    outs = _np_coll.grouped_allreduce([_host(t, "grouped_allreduce") for t in tensors],
                                      average, name, op, prescale_factor, postscale_factor,
                                      process_set)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, op=None) -> list:
    """In-place :func:`grouped_allreduce`; returns ``tensors``."""
    tensors = list(tensors)
    outs = _np_coll.grouped_allreduce([_host(t, "grouped_allreduce_") for t in tensors],
                                      average, name, op, prescale_factor, postscale_factor,
                                      process_set)
    return [_write(t, o) for o, t in zip(outs, tensors)]


def allgather(tensor, name=None, priority=0, process_set=None):
    """Concatenate every worker's ``tensor`` along the first dimension (which may differ
    between workers; the other dimensions and the dtype must agree)."""
    return _nd(_np_coll.allgather(_host(tensor, "allgather"), name, process_set), tensor)


def grouped_allgather(tensors, name=None, priority=0, process_set=None) -> list:
    """Allgather every NDArray of ``tensors`` in one operation."""
    tensors = list(tensors)
    outs = _np_coll.grouped_allgather([_host(t, "grouped_allgather") for t in tensors], name,
                                      process_set)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


def broadcast(tensor, root_rank, name=None, priority=0, process_set=None):
    """Rank ``root_rank``'s ``tensor`` on every worker (a new NDArray; every worker must pass
    the same root rank, shape and dtype, else all get an error naming both ranks)."""
    return _nd(_np_coll.broadcast(_host(tensor, "broadcast"), root_rank, name, process_set),
               tensor)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=None):
    """In-place :func:`broadcast`; returns ``tensor``."""
    return _write(tensor, _np_coll.broadcast(_host(tensor, "broadcast_"), root_rank, name,
                                             process_set))


def alltoall(tensor, splits=None, name=None, priority=0, process_set=None):
    """Send ``splits[i]`` rows of ``tensor`` to worker ``i`` (equal parts without ``splits``);
    returns the rows received by sending rank, and the received splits (an int32 NDArray)
    when ``splits`` is given, as Horovod."""
    sp = None
    if splits is not None:
        sp = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
    res = _np_coll.alltoall(_host(tensor, "alltoall"), sp, name, process_set)
    if splits is None:
        return _nd(res, tensor)
    out, received = res
    return _nd(out, tensor), mx.nd.array(received.astype(np.int32), dtype=np.int32)


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every worker (Average or Sum) and return this worker's block
    of rows (the first ``n % size`` workers get one row more)."""
    return _nd(_np_coll.reducescatter(_host(tensor, "reducescatter"), name, op, process_set,
                                      prescale_factor, postscale_factor), tensor)


def grouped_reducescatter(tensors, op=Average, name=None, priority=0, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0) -> list:
    """Reducescatter every NDArray of ``tensors`` in one operation."""
    tensors = list(tensors)
    outs = _np_coll.grouped_reducescatter([_host(t, "grouped_reducescatter")
                                           for t in tensors], name, op, process_set,
                                          prescale_factor, postscale_factor)
    return [_nd(o, t) for o, t in zip(outs, tensors)]


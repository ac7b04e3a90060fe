"""Horovod's collectives on numpy arrays: the core's
(:mod:`byteps.core.collective.ops`, which decides every rule: names, ops, root ranks,
dtypes by :mod:`byteps.core.collective.carry`, results in the input's dtype and shape); this
module only checks that it is given arrays.

Every operation takes ``process_set=`` (passed to the core's process sets where the core has
them; otherwise only the global set) and has an ``*_async`` form whose handle
:func:`synchronize` finishes (and :func:`poll` asks).  Without ``name`` the core numbers the
call, so every rank must make its unnamed calls in the same order.
"""
from __future__ import annotations

import threading

import numpy as np

from byteps.core.collective import ops as _coll
from byteps.core.collective import objects as _objects
from byteps.core.api.basics import process_set_kw
from byteps.core.collective.ops import barrier  # noqa: F401  (exported: the one barrier)

Average, Sum, Adasum = _coll.AVERAGE, _coll.SUM, _coll.ADASUM
Min, Max, Product = _coll.MIN, _coll.MAX, _coll.PRODUCT
ReduceOp = _coll.ReduceOp

__all__ = ["Adasum", "allgather", "allgather_async", "allgather_object", "allreduce",
           "allreduce_async", "alltoall", "alltoall_async", "Average", "broadcast",
           "broadcast_async", "broadcast_object", "grouped_allgather", "grouped_allgather_async",
           "grouped_allreduce", "grouped_allreduce_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "Max", "Min", "Product", "ReduceOp", "reducescatter",
           "reducescatter_async", "Sum"]

_lock = threading.Lock()
_finish: dict[int, object] = {}      # handle -> turns the core's result into the user's


def _register(handle: int, fn) -> int:
    with _lock:
        _finish[handle] = fn
    return handle


def finish(handle: int, result):
    """The user's result of a handle of this module (others: unchanged)."""
    with _lock:
        fn = _finish.pop(handle, None)
    return result if fn is None else fn(result)


def discard(handle: int) -> None:
    """Forget a handle whose operation failed."""
    with _lock:
        _finish.pop(handle, None)


def _array(a, what: str) -> np.ndarray:
    if not isinstance(a, (np.ndarray, np.generic, int, float, bool, list, tuple)):
        raise TypeError(f"{what} expects a numpy array, got {type(a).__name__}")
    return np.asarray(a)


# ------------------------------------------------------------------ allreduce
def allreduce_async(array, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None) -> int:
    """Start reducing ``array`` over every worker (default: average; ``op`` Sum, Average,
    Min, Max or Product); the result keeps ``array``'s dtype and shape."""
    kw = process_set_kw(process_set, "allreduce")
    return _coll.allreduce_async(_array(array, "allreduce"), name, average, op,
                                 prescale_factor, postscale_factor, **kw)


def allreduce(array, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None) -> np.ndarray:
    """:func:`allreduce_async` + :func:`synchronize`."""
    return _sync(allreduce_async(array, average, name, op, prescale_factor, postscale_factor,
                                 process_set))


def grouped_allreduce_async(arrays, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None) -> int:
    """Start reducing every array of ``arrays`` (one handle; the result is a list)."""
    kw = process_set_kw(process_set, "grouped_allreduce")
    return _coll.grouped_allreduce_async([_array(a, "grouped_allreduce") for a in arrays],
                                         name, average, op, prescale_factor,
                                         postscale_factor, **kw)


def grouped_allreduce(arrays, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None) -> list:
    return _sync(grouped_allreduce_async(arrays, average, name, op, prescale_factor,
                                         postscale_factor, process_set))


# ------------------------------------------------------------------ allgather
def allgather_async(array, name=None, process_set=None) -> int:
    """Start concatenating every worker's ``array`` along the first dimension (which may
    differ between workers; dtype and the other dimensions must agree)."""
    kw = process_set_kw(process_set, "allgather")
    return _coll.allgather_async(_array(array, "allgather"), name, **kw)


def allgather(array, name=None, process_set=None) -> np.ndarray:
    return _sync(allgather_async(array, name, process_set))


def grouped_allgather_async(arrays, name=None, process_set=None) -> int:
    """Start an allgather of every array (one handle; the result is a list)."""
    kw = process_set_kw(process_set, "grouped_allgather")
    return _coll.grouped_allgather_async([_array(a, "grouped_allgather") for a in arrays],
                                         name, **kw)


def grouped_allgather(arrays, name=None, process_set=None) -> list:
    return _sync(grouped_allgather_async(arrays, name, process_set))


# ------------------------------------------------------------------ broadcast
def broadcast_async(array, root_rank: int, name=None, process_set=None) -> int:
    """Start sending rank ``root_rank``'s ``array`` to every worker (every worker must pass
    the same root rank, shape and dtype, else every worker gets an error naming both
    ranks)."""
    kw = process_set_kw(process_set, "broadcast")
    return _coll.broadcast_async(_array(array, "broadcast"), root_rank, name, **kw)


def broadcast(array, root_rank: int, name=None, process_set=None) -> np.ndarray:
    """Rank ``root_rank``'s ``array`` on every worker (a new array)."""
    return _sync(broadcast_async(array, root_rank, name, process_set))


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(array, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start reducing ``array`` over every worker (Average or Sum); each worker gets its
    block of rows (the first ``n % size`` workers one row more)."""
    kw = process_set_kw(process_set, "reducescatter")
    return _coll.reducescatter_async(_array(array, "reducescatter"), name, None, op,
                                     prescale_factor, postscale_factor, **kw)


def reducescatter(array, name=None, op=Average, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0) -> np.ndarray:
    return _sync(reducescatter_async(array, name, op, process_set, prescale_factor,
                                     postscale_factor))


def grouped_reducescatter_async(arrays, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start a reducescatter of every array (one handle; the result is a list)."""
    kw = process_set_kw(process_set, "grouped_reducescatter")
    return _coll.grouped_reducescatter_async(
        [_array(a, "grouped_reducescatter") for a in arrays], name, None, op, prescale_factor,
        postscale_factor, **kw)


def grouped_reducescatter(arrays, name=None, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0) -> list:
    return _sync(grouped_reducescatter_async(arrays, name, op, process_set, prescale_factor,
                                             postscale_factor))


# ------------------------------------------------------------------ alltoall
def alltoall_async(array, splits=None, name=None, process_set=None) -> int:
    """Start sending ``splits[i]`` rows of ``array`` to worker ``i`` (equal parts without
    ``splits``); the result is the rows received by sending rank, plus the received
    splits when ``splits`` is given (as Horovod)."""
    kw = process_set_kw(process_set, "alltoall")
    sp = None if splits is None else np.asarray(splits)
    h = _coll.alltoall_async(_array(array, "alltoall"), sp, name, **kw)
    return _register(h, lambda r: r[0]) if splits is None else h


def alltoall(array, splits=None, name=None, process_set=None):
    return _sync(alltoall_async(array, splits, name, process_set))


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=None):
    """Rank ``root_rank``'s ``obj`` on every rank (msgpack, never pickle: plain values,
    lists, tuples, dicts, numpy arrays, argparse.Namespace, dataclasses; core codec)."""
    return _objects.broadcast_object(obj, root_rank, name,
                                     **process_set_kw(process_set, "broadcast_object"))


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's ``obj``, as a list in rank order (msgpack, never pickle)."""
    return _objects.allgather_object(obj, name,
                                     **process_set_kw(process_set, "allgather_object"))


def _sync(handle: int):
    from byteps.numpy import synchronize
    return synchronize(handle)

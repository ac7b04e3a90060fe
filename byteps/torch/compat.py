"""Horovod names on top of byteps.torch, so ``import byteps.torch as hvd`` works.

Every rule (op resolution, scaling, naming, agreement between ranks, row layouts) is
decided in :mod:`byteps.core.collective.ops` on numpy arrays; this module only converts
tensors (dtype, device), makes the operations differentiable where Horovod does, and
turns handles' results back into tensors.  See docs/torch.md for the table of names.
"""
from __future__ import annotations

import numpy as np
import torch

from byteps.core import api as _core
from byteps.core.collective import ops as _coll
from byteps.core.collective import objects as _core_objects
from byteps.core.collective.ops import ReduceOp, resolve_op
from byteps.core.collective.rules import sum_or_average as resolve_average  # noqa: F401 (optimizer)
from byteps.torch import _objects
from byteps.torch.compression import Compression
from byteps.torch.ops import _handles, _lock, host_array, rank, size, synchronize

__all__ = ["Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "ReduceOp",
           "Sum", "allgather", "allgather_async", "allgather_object", "allreduce",
           "allreduce_", "allreduce_async", "allreduce_async_", "broadcast", "broadcast_",
           "broadcast_async", "broadcast_async_", "grouped_allgather",
           "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
           "grouped_allreduce_async", "grouped_allreduce_async_"]

Average, Sum, Adasum = _coll.AVERAGE, _coll.SUM, _coll.ADASUM
Min, Max, Product = _coll.MIN, _coll.MAX, _coll.PRODUCT
HorovodInternalError = _core.BytePSError     # Horovod's name for a failed collective


def _set_size(process_set) -> int:
    ps = _coll._set(process_set)
    return size() if ps is None else len(ps.ranks)


def _set_rank(process_set) -> int:
    ps = _coll._set(process_set)
    return rank() if ps is None else ps.ranks.index(rank())


# ------------------------------------------------------------------ tensors <-> arrays
_np = host_array          # a host numpy array for the core (which carries every dtype)


def _torch(arr: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr).reshape(arr.shape)).to(like.device,
                                                                            like.dtype)


class _Result:
    """Turns a collective handle's numpy result into tensors (and fills in-place targets)."""
    __slots__ = ("convert",)

    def __init__(self, convert):
        self.convert = convert

    def finish(self, result=None):
        return self.convert(result)


def _register(handle: int, convert) -> int:
    with _lock:
        _handles[handle] = _Result(convert)
    return handle


def _into(targets):
    def fill(results):
        with torch.no_grad():
            for t, r in zip(targets, results):
                t.copy_(torch.from_numpy(np.ascontiguousarray(r)).reshape(t.shape))
        return targets
    return fill


# ------------------------------------------------------------------ allreduce
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None) -> int:
    """Start an allreduce (default op Average); ``synchronize(handle)`` returns the result."""
    h = _coll.allreduce_async((_np(tensor, "allreduce")), name, average, op,
                              prescale_factor, postscale_factor, process_set=process_set)
    return _register(h, lambda r: _torch(r, tensor).reshape(tensor.shape))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None) -> int:
    """In-place allreduce_async: ``synchronize`` writes the result into ``tensor``."""
    h = _coll.allreduce_async((_np(tensor, "allreduce")), name, average, op,
                              prescale_factor, postscale_factor, process_set=process_set)
    return _register(h, lambda r: _into([tensor])([r])[0])


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, pre, post, ps):
        ctx.args = (average, op, pre, post, ps)
        return synchronize(allreduce_async(tensor, average, name, op, pre, post, ps))

    @staticmethod
    def backward(ctx, grad):
        average, op, pre, post, ps = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), average, None, op, pre, post,
                                            ps)), None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Horovod's allreduce (default op Average; Sum, Min, Max, Product); differentiable."""
    resolve_op(average, op)                      # refuse bad arguments before compressing
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor,
                           process_set)
    return compression.decompress(out, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None) -> int:
    """Start an allreduce of every tensor; ``synchronize`` returns a list."""
    tensors = list(tensors)
    h = _coll.grouped_allreduce_async([(_np(t, "grouped_allreduce")) for t in tensors],
                                      name, average, op, prescale_factor, postscale_factor,
                                      process_set)
    return _register(h, lambda rs: [_torch(r, t).reshape(t.shape)
                                    for r, t in zip(rs, tensors)])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None) -> int:
    """In-place grouped_allreduce_async."""
    tensors = list(tensors)
    h = _coll.grouped_allreduce_async([(_np(t, "grouped_allreduce")) for t in tensors],
                                      name, average, op, prescale_factor, postscale_factor,
                                      process_set)
    return _register(h, _into(tensors))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, pre, post, ps, *tensors):
        ctx.args = (average, op, pre, post, ps)
        return tuple(synchronize(grouped_allreduce_async(tensors, average, name, op, pre,
                                                         post, ps)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, ps = ctx.args
        out = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], average,
                                                  None, op, pre, post, ps))
        return (None, None, None, None, None, None, *out)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None) -> list:
    """Allreduce every tensor of ``tensors`` in one operation; differentiable."""
    resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                   process_set, *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None) -> list:
    """In-place grouped_allreduce; returns ``tensors``."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ------------------------------------------------------------------ allgather
def allgather_async(tensor, name=None, process_set=None) -> int:
    """Start an allgather (first dimensions may differ between ranks)."""
    return _register(_coll.allgather_async(_np(tensor, "allgather"), name, process_set),
                     lambda r: _torch(r, tensor))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.dim, ctx.ps = (tensor.shape[0] if tensor.dim() else 1), ps
        return synchronize(allgather_async(tensor, name, ps))

    @staticmethod
    def backward(ctx, grad):
        # as Horovod (>= 0.23): the gathered gradient is averaged over the ranks, each
        # takes its own rows
        reduced = synchronize(allreduce_async(grad.contiguous(), average=True,
                                              process_set=ctx.ps))
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64),
                                           process_set=ctx.ps))
        offset = int(dims[:_set_rank(ctx.ps)].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ); differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=None) -> int:
    """Start an allgather of every tensor; ``synchronize`` returns a list."""
    tensors = list(tensors)
    h = _coll.grouped_allgather_async([_np(t, "grouped_allgather") for t in tensors], name,
                                      process_set)
    return _register(h, lambda rs: [_torch(r, t) for r, t in zip(rs, tensors)])


def grouped_allgather(tensors, name=None, process_set=None) -> list:
    """Allgather every tensor of ``tensors`` in one operation; differentiable (with a
    tensor that requires grad, each is one differentiable allgather)."""
    tensors = list(tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        name = _coll.check_name(name, "grouped_allgather", process_set)
        return [allgather(t, f"{name}.{i}", process_set) for i, t in enumerate(tensors)]
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's ``obj`` as a list by rank (msgpack, never pickle; see broadcast_object):
    the core's :func:`byteps.core.collective.objects.allgather_object` with torch tensors
    encoded."""
    return _core_objects.allgather_object(obj, name, codec=_objects.CODEC,
                                          process_set=process_set)


# ------------------------------------------------------------------ broadcast
def broadcast_async(tensor, root_rank: int, name=None, process_set=None) -> int:
    """Start a broadcast of rank ``root_rank``'s ``tensor``; ``synchronize`` returns it."""
    return _register(_coll.broadcast_async(_np(tensor, "broadcast"), root_rank, name,
                                           process_set), lambda r: _torch(r, tensor))


def broadcast_async_(tensor, root_rank: int, name=None, process_set=None) -> int:
    """In-place broadcast_async: ``synchronize`` writes the root's value into ``tensor``."""
    return _register(_coll.broadcast_async(_np(tensor, "broadcast"), root_rank, name,
                                           process_set), lambda r: _into([tensor])([r])[0])


def broadcast_(tensor, root_rank: int, name=None, process_set=None):
    """Overwrite ``tensor`` with rank ``root_rank``'s value; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.root, ctx.ps = root_rank, ps
        return synchronize(broadcast_async(tensor, root_rank, name, ps))

    @staticmethod
    def backward(ctx, grad):
        # as Horovod (>= 0.23): the gradients are averaged and go to the root only
        reduced = synchronize(allreduce_async(grad.contiguous(), average=True,
                                              process_set=ctx.ps))
        if rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank: int, name=None, process_set=None):
    """Return rank ``root_rank``'s ``tensor`` (a new tensor) on every rank; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


from byteps.torch.compat_more import *  # noqa: E402,F401,F403  (reducescatter, alltoall, ...)
from byteps.torch.compat_more import __all__ as _more  # noqa: E402

__all__ = __all__ + list(_more)

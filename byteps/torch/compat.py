"""Horovod names on top of byteps.torch, so ``import byteps.torch as hvd`` works.

Every rule (op resolution, scaling, naming, agreement between ranks, row layouts) is
decided in :mod:`byteps.core.collectives` on numpy arrays; this module only converts
tensors (dtype, device), makes the operations differentiable where Horovod does, and
turns handles' results back into tensors.  See docs/torch.md for the table of names.
"""
from __future__ import annotations

import numpy as np
import torch

from byteps.core import api as _core
from byteps.core import collectives as _coll
from byteps.core.collectives import ReduceOp, resolve_op
from byteps.torch import _objects
from byteps.torch.compression import Compression
from byteps.torch.functions import _broadcast_bytes, broadcast_inplace
from byteps.torch.ops import (
    _auto_name,
    _handles,
    _lock,
    _wire_dtype,
    async_mode,
    local_size,
    rank,
    size,
    synchronize,
)

__all__ = ["Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "ReduceOp",
           "Sum", "allgather", "allgather_async", "allgather_object", "allreduce",
           "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
           "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
           "byteps_built", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
           "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
           "is_homogeneous", "mpi_built", "mpi_enabled", "mpi_threads_supported",
           "nccl_built", "reducescatter", "reducescatter_async", "rocm_built",
           "start_timeline", "stop_timeline"]

Average, Sum, Adasum = _coll.AVERAGE, _coll.SUM, _coll.ADASUM
Min, Max, Product = _coll.MIN, _coll.MAX, _coll.PRODUCT
HorovodInternalError = _core.BytePSError     # Horovod's name for a failed collective


def resolve_average(average, op) -> bool:
    """``average``/``op`` for operations that can only sum or average (the optimizer)."""
    wire, avg = resolve_op(average, op)
    if wire:
        raise ValueError(f"op={op!r} is not supported here (gradients are summed or "
                         f"averaged); use hvd.Average or hvd.Sum")
    return avg


def _no_process_set(process_set) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise ValueError("process_set is not supported by byteps: every worker takes part "
                         "(pass None or the global process set)")


# ------------------------------------------------------------------ tensors <-> arrays
def _np(t: torch.Tensor, what: str) -> np.ndarray:
    """A host numpy array of ``t`` in a dtype the core carries (a view when possible)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise TypeError(f"{what}: sparse tensors are not supported; call .to_dense() first")
    return t.detach().to("cpu", _wire_dtype(t, what)).contiguous().numpy()


def _torch(arr: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr)).to(like.device, like.dtype)


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
def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(1) if a.ndim == 0 else a


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None) -> int:
    """Start an allreduce (default op Average); ``synchronize(handle)`` returns the result."""
    _no_process_set(process_set)
    h = _coll.allreduce_async(_flat(_np(tensor, "allreduce")), name, average, op,
                              prescale_factor, postscale_factor)
    return _register(h, lambda r: _torch(r, tensor).reshape(tensor.shape))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None) -> int:
    """In-place allreduce_async: ``synchronize`` writes the result into ``tensor``."""
    _no_process_set(process_set)
    h = _coll.allreduce_async(_flat(_np(tensor, "allreduce")), name, average, op,
                              prescale_factor, postscale_factor)
    return _register(h, lambda r: _into([tensor])([r])[0])


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, pre, post):
        ctx.args = (average, op, pre, post)
        return synchronize(allreduce_async(tensor, average, name, op, pre, post))

    @staticmethod
    def backward(ctx, grad):
        average, op, pre, post = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), average, None, op, pre, post)),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Horovod's allreduce (default op Average; Sum, Min, Max, Product); differentiable."""
    _no_process_set(process_set)
    resolve_op(average, op)                      # refuse bad arguments before compressing
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None) -> int:
    """Start an allreduce of every tensor; ``synchronize`` returns a list."""
    _no_process_set(process_set)
    tensors = list(tensors)
    h = _coll.grouped_allreduce_async([_flat(_np(t, "grouped_allreduce")) for t in tensors],
                                      name, average, op, prescale_factor, postscale_factor)
    return _register(h, lambda rs: [_torch(r, t).reshape(t.shape)
                                    for r, t in zip(rs, tensors)])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None) -> int:
    """In-place grouped_allreduce_async."""
    _no_process_set(process_set)
    tensors = list(tensors)
    h = _coll.grouped_allreduce_async([_flat(_np(t, "grouped_allreduce")) for t in tensors],
                                      name, average, op, prescale_factor, postscale_factor)
    return _register(h, _into(tensors))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, pre, post, *tensors):
        ctx.args = (average, op, pre, post)
        return tuple(synchronize(grouped_allreduce_async(tensors, average, name, op, pre,
                                                         post)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post = ctx.args
        out = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], average,
                                                  None, op, pre, post))
        return (None, None, None, None, None, *out)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None) -> list:
    """Allreduce every tensor of ``tensors`` in one operation; differentiable."""
    _no_process_set(process_set)
    resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                   *[c for c, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None) -> list:
    """In-place grouped_allreduce; returns ``tensors``."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ------------------------------------------------------------------ allgather
def allgather_async(tensor, name=None, process_set=None) -> int:
    """Start an allgather (first dimensions may differ between ranks)."""
    _no_process_set(process_set)
    return _register(_coll.allgather_async(_np(tensor, "allgather"), name),
                     lambda r: _torch(r, tensor))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        reduced = synchronize(allreduce_async(grad.contiguous(), average=True))
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64)))
        offset = int(dims[:rank()].sum())
        return reduced.narrow(0, offset, ctx.dim), None


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ); differentiable."""
    _no_process_set(process_set)
    return _Allgather.apply(tensor, name)


def grouped_allgather_async(tensors, name=None, process_set=None) -> int:
    """Start an allgather of every tensor; ``synchronize`` returns a list."""
    _no_process_set(process_set)
    tensors = list(tensors)
    h = _coll.grouped_allgather_async([_np(t, "grouped_allgather") for t in tensors], name)
    return _register(h, lambda rs: [_torch(r, t) for r, t in zip(rs, tensors)])


def grouped_allgather(tensors, name=None, process_set=None) -> list:
    """Allgather every tensor of ``tensors`` in one operation."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's ``obj`` as a list by rank (msgpack, never pickle; see broadcast_object)."""
    _no_process_set(process_set)
    name = "allgather_object." + (name or _auto_name("gather_obj"))
    data = _objects.encode(obj)
    out = []
    for root in range(size()):
        raw = _broadcast_bytes(data if root == rank() else None, root, f"{name}.{root}")
        out.append(_objects.decode(raw))
    return out


# ------------------------------------------------------------------ broadcast
def broadcast_async(tensor, root_rank: int, name=None, process_set=None) -> int:
    """Start a broadcast of rank ``root_rank``'s ``tensor``; ``synchronize`` returns it."""
    _no_process_set(process_set)
    return _register(_coll.broadcast_async(_np(tensor, "broadcast"), root_rank, name),
                     lambda r: _torch(r, tensor))


def broadcast_async_(tensor, root_rank: int, name=None, process_set=None) -> int:
    """In-place broadcast_async: ``synchronize`` writes the root's value into ``tensor``."""
    _no_process_set(process_set)
    return _register(_coll.broadcast_async(_np(tensor, "broadcast"), root_rank, name),
                     lambda r: _into([tensor])([r])[0])


def broadcast_(tensor, root_rank: int, name=None, process_set=None):
    """Overwrite ``tensor`` with rank ``root_rank``'s value; returns it."""
    _no_process_set(process_set)
    if async_mode():       # servers add pushes at once: the root pushes, a barrier, the rest pull
        _coll.check_root(root_rank, "broadcast")
        broadcast_inplace([("broadcast." + (name or _auto_name("bcast")), tensor)], root_rank)
        return tensor
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        reduced = synchronize(allreduce_async(grad.contiguous(), average=True))
        if rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor, root_rank: int, name=None, process_set=None):
    """Return rank ``root_rank``'s ``tensor`` (a new tensor) on every rank; differentiable."""
    _no_process_set(process_set)
    if async_mode():
        return broadcast_(tensor.detach().clone(), root_rank, name)
    return _Broadcast.apply(tensor, root_rank, name)


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start a reducescatter; ``synchronize`` returns this rank's block of rows."""
    _no_process_set(process_set)
    h = _coll.reducescatter_async(_np(tensor, "reducescatter"), name, None, op,
                                  prescale_factor, postscale_factor)
    return _register(h, lambda r: _torch(r, tensor))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post):
        ctx.args = (op, pre, post)
        return synchronize(reducescatter_async(tensor, name, op, None, pre, post))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post = ctx.args
        # Horovod's convention (as for allreduce): the gradient is reduced with the same
        # op, so with Sum every rank's identical gathered gradient counts size() times
        g = synchronize(allgather_async(grad.contiguous()))
        factor = pre * post * (size() if resolve_op(None, op) == (0, False) else 1)
        return (g * factor if factor != 1 else g), None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every rank and return this rank's block of rows (the first
    ``n % size`` ranks get one row more); differentiable."""
    _no_process_set(process_set)
    wire, _ = resolve_op(None, op)
    if wire:
        raise ValueError(f"reducescatter: op={op!r} is not supported; use hvd.Average or "
                         f"hvd.Sum (as Horovod)")
    compressed, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start a reducescatter of every tensor; ``synchronize`` returns a list."""
    _no_process_set(process_set)
    tensors = list(tensors)
    h = _coll.grouped_reducescatter_async([_np(t, "grouped_reducescatter") for t in tensors],
                                          name, None, op, prescale_factor, postscale_factor)
    return _register(h, lambda rs: [_torch(r, t) for r, t in zip(rs, tensors)])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """Reducescatter every tensor of ``tensors`` in one operation."""
    pairs = [compression.compress(t) for t in tensors]
    outs = synchronize(grouped_reducescatter_async([c for c, _ in pairs], name, op, process_set,
                                                   prescale_factor, postscale_factor))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


# ------------------------------------------------------------------ alltoall
def _splits(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return splits.detach().cpu().numpy()
    return np.asarray(splits)


def alltoall_async(tensor, splits=None, name=None, process_set=None) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``."""
    _no_process_set(process_set)
    h = _coll.alltoall_async(_np(tensor, "alltoall"), _splits(splits), name)
    return _register(h, lambda r: (_torch(r[0], tensor),
                                   torch.from_numpy(r[1].astype(np.int32))))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        g, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received))
        return g, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[i]`` rows to rank ``i`` (equal parts without ``splits``); returns the
    received rows by sending rank, plus ``received_splits`` when ``splits`` is given;
    differentiable."""
    _no_process_set(process_set)
    out, received = _Alltoall.apply(tensor, splits, name)
    return out if splits is None else (out, received)


# ------------------------------------------------------------------ the rest
def barrier(process_set=None) -> None:
    """Wait until every worker reaches the barrier."""
    _no_process_set(process_set)
    _core.barrier()


def cross_rank() -> int:
    """Index of this worker's host."""
    return rank() // local_size()


def cross_size() -> int:
    """Number of worker hosts."""
    return size() // local_size()


def is_homogeneous() -> bool:
    """True when every host runs the same number of workers."""
    return size() % local_size() == 0


def _cuda() -> bool:
    return torch.cuda.is_available()


def mpi_built() -> bool:
    """False: byteps does not use MPI."""
    return _coll.build_info()["mpi_built"]


def mpi_enabled() -> bool:
    """False: byteps does not use MPI."""
    return _coll.build_info()["mpi_enabled"]


def mpi_threads_supported() -> bool:
    """False: byteps does not use MPI."""
    return _coll.build_info()["mpi_threads_supported"]


def gloo_built() -> bool:
    """False: byteps does not use Gloo (its own parameter servers over ZeroMQ)."""
    return _coll.build_info()["gloo_built"]


def gloo_enabled() -> bool:
    """False: byteps does not use Gloo."""
    return _coll.build_info()["gloo_enabled"]


def nccl_built() -> bool:
    """True where CUDA is available (GPU tensors are handled), else False."""
    return _cuda()


def cuda_built() -> bool:
    """True where CUDA is available to torch (GPU tensors are staged through host memory)."""
    return _cuda()


def rocm_built() -> bool:
    """True where torch runs on ROCm with a GPU available."""
    return _cuda() and getattr(torch.version, "hip", None) is not None


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return _coll.build_info()["ddl_built"]


def ccl_built() -> bool:
    """False: no oneCCL."""
    return _coll.build_info()["ccl_built"]


def byteps_built() -> bool:
    """True."""
    return True


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's timeline: record this worker's trace and write it to ``file_path`` at
    :func:`stop_timeline` (Chrome trace JSON, docs/timeline.md)."""
    _core.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` and write it."""
    _core.stop_timeline()

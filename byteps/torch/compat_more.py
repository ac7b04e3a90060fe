"""More of Horovod's names for byteps.torch: reducescatter, alltoall, barrier, process sets,
sparse allreduce and the build-information queries (see :mod:`byteps.torch.compat`).

The rules live in :mod:`byteps.core.collective.ops` and :mod:`byteps.core.collective.process_sets`;
this module converts tensors and makes the operations differentiable as Horovod does.
"""
from __future__ import annotations

import numpy as np
import torch

from byteps.core.collective import ops as _coll
from byteps.core.collective import process_sets as _ps
from byteps.core.collective.ops import barrier, resolve_op  # noqa: F401 (barrier: exported)
from byteps.core.collective.process_sets import ProcessSet, add_process_set, global_process_set
from byteps.torch.compression import Compression
from byteps.torch.ops import local_size, rank, size, synchronize

__all__ = ["ProcessSet", "add_process_set", "alltoall", "alltoall_async", "barrier",
           "byteps_built", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
           "gloo_built", "gloo_enabled", "global_process_set", "grouped_reducescatter",
           "grouped_reducescatter_async", "is_homogeneous", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "nccl_built", "reducescatter", "reducescatter_async",
           "remove_process_set", "rocm_built", "sparse_allreduce_async", "start_timeline",
           "stop_timeline"]


def _c():
    from byteps.torch import compat
    return compat


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start a reducescatter (default op Average); ``synchronize`` returns this rank's
    block of rows."""
    c = _c()
    h = _coll.reducescatter_async(c._np(tensor, "reducescatter"), name, None, op,
                                  prescale_factor, postscale_factor, process_set)
    return c._register(h, lambda r: c._torch(r, tensor))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, ps):
        ctx.args = (op, pre, post, ps)
        return synchronize(reducescatter_async(tensor, name, op, ps, pre, post))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        # Horovod's convention (as for allreduce): the gradient is reduced with the same
        # op, so with Sum every rank's identical gathered gradient counts size() times
        g = synchronize(_c().allgather_async(grad.contiguous(), process_set=ps))
        n = _c()._set_size(ps)
        factor = pre * post * (1 if resolve_op(None, op, "reducescatter")[1] else n)
        return (g * factor if factor != 1 else g), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=None,
                  process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every rank and return this rank's block of rows (the first
    ``n % size`` ranks get one row more); differentiable."""
    resolve_op(None, op, "reducescatter")           # refuse bad arguments before compressing
    compressed, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start a reducescatter of every tensor; ``synchronize`` returns a list."""
    c = _c()
    tensors = list(tensors)
    h = _coll.grouped_reducescatter_async([c._np(t, "grouped_reducescatter") for t in tensors],
                                          name, None, op, prescale_factor, postscale_factor,
                                          process_set)
    return c._register(h, lambda rs: [c._torch(r, t) for r, t in zip(rs, tensors)])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """Reducescatter every tensor of ``tensors`` in one operation; differentiable (with a
    tensor that requires grad, each is one differentiable reducescatter)."""
    tensors = list(tensors)
    if _needs_grad(tensors):
        name = _coll.check_name(name, "grouped_reducescatter", process_set)
        return [reducescatter(t, f"{name}.{i}", compression, op, process_set, prescale_factor,
                              postscale_factor) for i, t in enumerate(tensors)]
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
    c = _c()
    h = _coll.alltoall_async(c._np(tensor, "alltoall"), _splits(splits), name, process_set)
    return c._register(h, lambda r: (c._torch(r[0], tensor),
                                     torch.from_numpy(r[1].astype(np.int32))))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = synchronize(alltoall_async(tensor, splits, name, ps))
        ctx.received, ctx.ps = received, ps
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        g, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received, None, ctx.ps))
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[i]`` rows to rank ``i`` (equal parts without ``splits``); returns the
    received rows by sending rank, plus ``received_splits`` when ``splits`` is given;
    differentiable."""
    out, received = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


def _needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ------------------------------------------------------------------ sparse
class SparseHandle(int):
    """The handle of :func:`sparse_allreduce_async`: an int for ``synchronize``, and
    callable as Horovod's (``handle()`` waits and returns the sparse result)."""

    def __call__(self):
        return _c().synchronize(int(self))


def sparse_allreduce_async(tensor, name=None, op=None, process_set=None) -> SparseHandle:
    """Allreduce a sparse COO tensor as Horovod does: its indices and values are gathered
    from every rank (duplicates are summed when the result is coalesced; ``op=Average``,
    the default, divides the values by the number of ranks).  ``synchronize(handle)`` or
    ``handle()`` returns the sparse result."""
    c = _c()
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO torch.Tensor")
    avg = resolve_op(None, op, "sparse_allreduce")[1]
    name = _coll.check_name(name, "sparse_allreduce", process_set)
    t = tensor.coalesce()
    idx = t.indices().transpose(0, 1).contiguous().numpy()
    vals = c._np(t.values(), "sparse_allreduce")
    h = _coll.grouped_allgather_async([idx, vals], name, process_set)
    n = c._set_size(process_set)

    def convert(rs):
        i = torch.from_numpy(np.ascontiguousarray(rs[0])).transpose(0, 1)
        v = torch.from_numpy(np.ascontiguousarray(rs[1])).to(tensor.dtype)
        if avg:
            v = v / n
        return torch.sparse_coo_tensor(i, v, tensor.shape).coalesce().to(tensor.device)
    return SparseHandle(c._register(h, convert))


# ------------------------------------------------------------------ the rest
def remove_process_set(process_set) -> bool:
    """Unregister ``process_set`` on every rank (every worker calls it)."""
    return _ps.remove_process_set(process_set)


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
    """False: byteps has no NCCL stage (CUDA tensors are staged through host memory)."""
    return _coll.build_info()["nccl_built"]


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
    """Horovod's timeline: rank 0 writes it to ``file_path`` as the job runs, until
    :func:`stop_timeline` (byteps/core/hvd_timeline.py, docs/timeline.md)."""
    from byteps.core import api
    api.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` and close its file."""
    from byteps.core import api
    api.stop_timeline()

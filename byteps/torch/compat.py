"""Horovod names on top of byteps.torch, so ``import byteps.torch as hvd`` works.

Reductions are sums or averages on the parameter servers (``Average`` and
``Sum``); ``Adasum``, ``Min``, ``Max`` and ``Product`` raise a clear error.
``broadcast`` is a sum in which the other ranks contribute zeros, and
``allgather`` a sum in which every rank fills its own rows of a zero buffer,
so both return exact copies.
"""
from __future__ import annotations

import torch

from byteps.torch import _objects
from byteps.torch.compression import Compression
from byteps.torch.functions import _broadcast_bytes, _check_root, broadcast_inplace
from byteps.torch.ops import (
    _auto_name,
    check_sync_mode,
    local_size,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    rank,
    size,
    synchronize,
)

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather",
           "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "broadcast", "broadcast_", "cross_rank", "cross_size", "mpi_threads_supported",
           "nccl_built"]


class ReduceOp:
    """A Horovod reduction op; only Average and Sum exist on a parameter server."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"hvd.{self.name}"


Average, Sum, Adasum = ReduceOp("Average"), ReduceOp("Sum"), ReduceOp("Adasum")
Min, Max, Product = ReduceOp("Min"), ReduceOp("Max"), ReduceOp("Product")


def resolve_average(average, op) -> bool:
    """Map Horovod's ``average``/``op`` arguments to push_pull's ``average``."""
    if op is None:
        return True if average is None else bool(average)
    if average is not None:
        raise ValueError("give either average= or op=, not both")
    if op is Average:
        return True
    if op is Sum:
        return False
    raise ValueError(f"op={op!r} is not supported by byteps (parameter servers sum); use "
                     f"hvd.Average or hvd.Sum")


def _scaled(tensor, factor):
    return tensor if factor == 1.0 else tensor * factor


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Horovod's allreduce: ``push_pull`` with ``op`` Average (default) or Sum."""
    avg = resolve_average(average, op)
    out = push_pull(_scaled(tensor, prescale_factor), average=avg, name=name,
                    compression=compression)
    return _scaled(out, postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None) -> int:
    """Start an allreduce; ``synchronize(handle)`` returns the result."""
    if postscale_factor != 1.0:
        raise ValueError("postscale_factor is not supported by allreduce_async; scale the "
                         "synchronized result instead")
    return push_pull_async(_scaled(tensor, prescale_factor), average=resolve_average(average, op),
                           name=name)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None) -> int:
    """In-place allreduce_async."""
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise ValueError("scale factors are not supported by in-place allreduce; scale the "
                         "tensor yourself")
    return push_pull_async_inplace(tensor, average=resolve_average(average, op), name=name)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def broadcast_(tensor, root_rank: int, name=None, process_set=None):
    """Overwrite ``tensor`` with rank ``root_rank``'s value; returns it."""
    _check_root(root_rank, "broadcast")
    broadcast_inplace([("broadcast." + (name or _auto_name("bcast")), tensor)], root_rank)
    return tensor


def broadcast(tensor, root_rank: int, name=None, process_set=None):
    """Return rank ``root_rank``'s ``tensor`` (a new tensor) on every rank."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ)."""
    check_sync_mode("allgather")
    name = "allgather." + (name or _auto_name("gather"))
    t = tensor.detach()
    if t.dim() == 0:
        raise ValueError(f"allgather of {name!r}: needs at least one dimension")
    counts = torch.zeros(size(), dtype=torch.int64)
    counts[rank()] = t.shape[0]
    counts = push_pull(counts, average=False, name=name + ".counts")
    total, start = int(counts.sum()), int(counts[:rank()].sum())
    buf = torch.zeros((total, *t.shape[1:]), dtype=t.dtype, device=t.device)
    buf[start:start + t.shape[0]] = t
    shape = "x".join(map(str, buf.shape))
    return synchronize(push_pull_async_inplace(buf, average=False, name=f"{name}.{shape}"))


def allgather_object(obj, name=None, process_set=None) -> list:
    """Every rank's ``obj`` as a list by rank (msgpack, never pickle; see broadcast_object)."""
    name = "allgather_object." + (name or _auto_name("gather_obj"))
    data = _objects.encode(obj)
    out = []
    for root in range(size()):
        raw = _broadcast_bytes(data if root == rank() else None, root, f"{name}.{root}")
        out.append(_objects.decode(raw))
    return out


def cross_rank() -> int:
    """Index of this worker's host."""
    return rank() // local_size()


def cross_size() -> int:
    """Number of worker hosts."""
    return size() // local_size()


def nccl_built() -> bool:
    """byteps reduces on CPU servers: False."""
    return False


def mpi_threads_supported() -> bool:
    """byteps does not use MPI: False."""
    return False

"""Tensor operations of the PyTorch plugin, built on :mod:`byteps.core.api`.

CPU tensors travel zero-copy: a contiguous tensor's ``numpy()`` view is handed
to the core as input and (for in-place operations) as output.  Tensors the
core cannot carry directly go through a per-name staging buffer:

* CUDA tensors are copied into pinned host memory before the push and copied
  back after the pull (the core sums on CPU servers);
* other dtypes travel as the core's one table says (:mod:`byteps.core.collective.carry`:
  ``bfloat16`` as ``float32``, ``int16`` as ``int32``, ``bool`` as ``uint8`` reduced
  logically), and come back in their own dtype;
* non-contiguous tensors are made contiguous.
"""
from __future__ import annotations

import threading

import torch

import numpy as np

from byteps.core import api as _core
from byteps.core.collective import carry as _carry
from byteps.core.api import BytePSError
from byteps.core.collective.rules import check_name
from byteps.torch.compression import Compression

__all__ = [
    "BytePSError",
    "declare",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_inplace",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]

_lock = threading.Lock()
_handles: dict[int, _Pending] = {}
_staging: dict[tuple, torch.Tensor] = {}


def init(lazy: bool = True, process_sets=None, comm=None) -> None:
    """Join the job described by the ``DMLC_*``/``BYTEPS_*`` environment.

    Without those variables this is a local job of size 1 (no network).
    ``lazy`` is accepted for compatibility with the original BytePS.  ``process_sets`` and
    ``comm``: Horovod's, as :func:`byteps.core.api.basics.init` takes them.
    """
    if not _core.is_initialized():
        # torch.optim imports torch._dynamo (~800 modules, seconds on a loaded machine)
        # on first use; do it before the engine thread has heartbeats to send, so a long
        # GIL-bound import cannot starve them.
        try:
            import torch._dynamo  # noqa: F401
        except ImportError:
            pass
    from byteps.core.api import basics
    basics.init(lazy, process_sets=process_sets, comm=comm)


def shutdown() -> None:
    """Leave the job; ``init()`` may be called again afterwards."""
    from byteps.core.api import basics
    basics.shutdown()      # first: what is still in flight (a CrossBarrier's) needs _handles
    with _lock:
        _handles.clear()
        _staging.clear()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return _core.is_initialized()


def rank() -> int:
    """Global rank of this worker process."""
    return _core.rank()


def size() -> int:
    """Number of worker processes in the job."""
    return _core.size()


def local_rank() -> int:
    """Rank of this worker among the workers of its host."""
    return _core.local_rank()


def local_size() -> int:
    """Number of workers on this host."""
    return _core.local_size()


def declare(name: str, compression_params: dict | None = None) -> int:
    """Declare a tensor name (optional: keys come from names, in any order);
    ``compression_params`` compresses it on the wire (docs/compression.md)."""
    _core.declare(name, compression_params=compression_params)
    return 0


class _Pending:
    """What a core handle needs to become a torch result."""
    __slots__ = ("output", "src", "staged_out", "tensor")

    def __init__(self, tensor, output, src, staged_out):
        self.tensor, self.output, self.src, self.staged_out = tensor, output, src, staged_out

    def finish(self, result=None) -> torch.Tensor:
        if self.staged_out is not None:
            with torch.no_grad():
                self.output.copy_(self.staged_out)
        return self.output


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _wire_dtype(t: torch.Tensor, name: str, copy: bool = False) -> torch.dtype:
    """The dtype ``t`` travels as (the core's table,
    :func:`byteps.core.collective.carry.wire_dtype`)."""
    to = _carry.wire_dtype(_dtype_name(t.dtype), copy)
    if to is None:
        from byteps.transport.wire import dtype_code
        dtype_code(_dtype_name(t.dtype), name)      # the core's error, naming the tensor
    return getattr(torch, to)


def host_array(t: torch.Tensor, what: str) -> np.ndarray:
    """``t`` as a host numpy array for the core's collectives: in its own dtype when numpy
    has it (the core carries it by its table), else (bfloat16, float8) in the dtype the
    table names."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise TypeError(f"{what}: sparse tensors are not supported; call .to_dense() first")
    t = t.detach().to("cpu").contiguous()
    try:
        return t.numpy()
    except TypeError:                   # a dtype numpy lacks
        return t.to(_wire_dtype(t, what, copy=True)).numpy()


def _stage(name: str, which: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A reusable host buffer for ``name`` (one op per name is in flight at a time)."""
    key = (name, which)
    buf = _staging.get(key)
    if buf is None or buf.shape != like.shape or buf.dtype != dtype:
        pin = like.is_cuda and torch.cuda.is_available()
        buf = torch.empty(like.shape, dtype=dtype, device="cpu", pin_memory=pin)
        _staging[key] = buf
    return buf


def _direct(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and _wire_dtype(t, "") == t.dtype and t.is_contiguous()


def check_sync_mode(what: str) -> None:
    """Refuse BYTEPS_ENABLE_ASYNC=1 where synchronous averaging is assumed (the core's
    rule ``async-wrapper``)."""
    from byteps.core.api import basics
    basics.refuse_async_wrapper(what)


def _check_tensor(tensor, name) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"push_pull expects a torch.Tensor, got {type(tensor).__name__} "
                        f"(name {name!r}); use byteps.numpy for numpy arrays")


def _push_pull_async(tensor: torch.Tensor, output: torch.Tensor, average: bool, name,
                     priority: int, compression_params: dict | None = None) -> int:
    _check_tensor(tensor, name)
    name = check_name(name, "push_pull")
    if tensor.is_sparse:
        raise TypeError(f"push_pull of tensor {name!r}: sparse tensors are not supported; "
                        f"call .to_dense() first")
    t = tensor.detach()
    inplace = output is tensor
    wire = _wire_dtype(t, name)
    staged_out = None
    if _direct(t):
        src = t.numpy()
        if inplace:
            out = src
        elif _direct(output) and output.dtype == t.dtype:
            out = output.detach().numpy()
        else:
            staged_out = _stage(name, "out", t, wire)
            out = staged_out.numpy()
    else:
        if t.is_cuda and not torch.cuda.is_available():
            raise BytePSError(f"push_pull of tensor {name!r}: CUDA tensor but CUDA is not "
                              f"available in this process")
        host = _stage(name, "in", t, wire)
        with torch.no_grad():
            host.copy_(t)          # blocking device-to-host copy (waits for the producer)
        src = host.numpy()
        if inplace:
            staged_out, out = host, src
        else:
            staged_out = _stage(name, "out", t, wire)
            out = staged_out.numpy()
    if src.ndim == 0:              # the core works on arrays of at least one dimension
        src, out = src.reshape(1), out.reshape(1)
    op, average = 0, bool(average)
    if t.dtype == torch.bool:               # the core's table: uint8, reduced logically
        op, average = _carry.bool_op(op, average)
    h = _core.push_pull_async(src, name, average=average, priority=int(priority),
                              out=out, compression_params=compression_params, op=op)
    with _lock:
        _handles[h] = _Pending(tensor, output, src, staged_out)
    return h


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                    version: int = 0, priority: int = 0,
                    compression_params: dict | None = None) -> int:
    """Start averaging (or summing) ``tensor`` over all workers; returns a handle.

    The input is not modified and must not change until :func:`synchronize`.
    Higher ``priority`` goes first.  ``version`` is accepted for compatibility
    and ignored.  Without a ``name``, one is generated from a per-process
    counter, so every rank must then issue its unnamed calls in the same order.
    ``compression_params`` compresses the tensor on the wire (docs/compression.md).
    """
    _check_tensor(tensor, name)
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _push_pull_async(tensor, output, average, name, priority, compression_params)


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True,
                            name: str | None = None, version: int = 0,
                            priority: int = 0, compression_params: dict | None = None) -> int:
    """Like :func:`push_pull_async` but the result overwrites ``tensor``."""
    return _push_pull_async(tensor, tensor, average, name, priority, compression_params)


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (never blocks)."""
    return _core.poll(handle)


def synchronize(handle: int) -> torch.Tensor:
    """Wait for ``handle`` and return its output tensor."""
    with _lock:
        pending = _handles.get(handle)
    if pending is None:
        raise ValueError(f"unknown or already synchronized handle {handle!r}")
    try:
        result = _core.synchronize(handle)
    finally:
        with _lock:
            _handles.pop(handle, None)
    return pending.finish(result)


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                      version: int = 0, priority: int = 0) -> torch.Tensor:
    """Average (or sum) ``tensor`` over all workers in place; returns ``tensor``."""
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority))


class _PushPull(torch.autograd.Function):
    """push_pull as an autograd op: the gradient is push_pulled the same way."""

    @staticmethod
    def forward(ctx, tensor, average, name, priority):
        ctx.average, ctx.name, ctx.priority = average, name, priority
        return synchronize(push_pull_async(tensor, average, name, 0, priority))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(push_pull_async(grad_output.contiguous(), ctx.average,
                                           ctx.name + ".backward", 0, ctx.priority))
        return grad, None, None, None


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None,
              version: int = 0, priority: int = 0,
              compression=Compression.none) -> torch.Tensor:
    """Average (or sum) ``tensor`` over all workers and return a new tensor.

    Differentiable: the gradient of the result is push_pulled back.  See
    :func:`push_pull_async` for ``name``, ``version`` and ``priority``.
    """
    name = check_name(name, "push_pull")
    compressed, cctx = compression.compress(tensor)
    out = _PushPull.apply(compressed, average, name, priority)
    return compression.decompress(out, cctx)

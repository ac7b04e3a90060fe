"""byteps.torch.parallel.DistributedDataParallel: a DDP-style module wrapper.

    model = DistributedDataParallel(model)
    loss_fn(model(x), y).backward()       # gradients are averaged when backward returns
    with model.no_sync():                 # accumulate locally, communicate later
        loss_fn(model(x2), y2).backward()

Rank 0's parameters and buffers are broadcast when the wrapper is built;
buffers are broadcast again before every forward pass when
``broadcast_buffers`` is true.  Every gradient's push_pull starts from its
accumulation hook (overlapping backward) and the last one is waited for at the
end of ``backward()``.  Parameters that got no gradient take part as zeros.
"""
from __future__ import annotations

import contextlib

import torch

from byteps.torch.compression import Compression
from byteps.torch.functions import broadcast_parameters
from byteps.torch.ops import check_sync_mode, push_pull_async_inplace, size, synchronize
from byteps.torch.optimizer import _register_hook

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.Module):
    """Average gradients of ``module`` over all workers during ``backward()``."""

    def __init__(self, module: torch.nn.Module, device_ids=None, broadcast_buffers: bool = True,
                 compression=Compression.none):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"DistributedDataParallel wraps a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError(f"device_ids={device_ids!r}: one device per process; start one "
                             f"worker per device with bpslaunch instead")
        check_sync_mode("DistributedDataParallel")
        self.module = module
        self.device_ids = device_ids
        self.broadcast_buffers = broadcast_buffers
        self._bps_compression = compression
        self._bps_sync = True
        self._bps_handles: dict = {}
        self._bps_waiting = False
        seen, named = set(), []
        for name, p in module.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                named.append((name, p))
        self._bps_params = [p for _, p in named]
        self._bps_names = {p: "DDP.Gradient." + n for n, p in named}
        self._bps_priority = {p: -i for i, (_, p) in enumerate(named)}
        broadcast_parameters(module.state_dict(), root_rank=0, prefix="DDP.Init.")
        self._bps_hooks = [_register_hook(p, self._bps_make_hook(p)) for p in self._bps_params]

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and size() > 1:
            buffers = [(n, b) for n, b in self.module.named_buffers() if b.numel()]
            if buffers:
                broadcast_parameters(buffers, root_rank=0, prefix="DDP.Buffer.")
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block backward() accumulates gradients without communicating."""
        old, self._bps_sync = self._bps_sync, False
        try:
            yield
        finally:
            self._bps_sync = old

    def _bps_make_hook(self, p):
        def hook(*_):
            if not self._bps_sync or p.grad is None:
                return
            if p in self._bps_handles:
                raise RuntimeError(f"gradient {self._bps_names[p]!r} was accumulated twice in "
                                   f"one backward pass; DistributedDataParallel expects "
                                   f"each parameter once per backward")
            self._bps_handles[p] = self._bps_push(p)
            if not self._bps_waiting:
                self._bps_waiting = True
                torch.autograd.Variable._execution_engine.queue_callback(self._bps_finish)
        return hook

    def _bps_push(self, p):
        compressed, ctx = self._bps_compression.compress(p.grad)
        return push_pull_async_inplace(compressed, average=True, name=self._bps_names[p],
                                       priority=self._bps_priority[p]), ctx

    def _bps_finish(self) -> None:
        """Runs when backward() ends: reduce the rest and wait for everything."""
        try:
            with torch.no_grad():
                for p in self._bps_params:
                    if p not in self._bps_handles:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        self._bps_handles[p] = self._bps_push(p)
                for p, (handle, ctx) in self._bps_handles.items():
                    result = self._bps_compression.decompress(synchronize(handle), ctx)
                    if result is not p.grad:
                        p.grad.copy_(result)
        finally:
            self._bps_handles.clear()
            self._bps_waiting = False

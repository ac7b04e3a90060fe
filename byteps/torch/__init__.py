"""byteps.torch — the PyTorch plugin, API-compatible with the original BytePS.

    import byteps.torch as bps
    bps.init()
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=bps.Compression.fp16)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)

Start it with ``bpslaunch --standalone --num-workers 2 --num-servers 2 python
train.py``; see docs/torch.md.
"""
try:
    import torch  # noqa: F401
except ImportError as _exc:
    from byteps import missing_framework
    raise missing_framework("torch", "torch", "byteps.torch", _exc) from _exc

from byteps.core.api import BytePSError, join
from byteps.torch.compat import __all__ as _horovod_names
from byteps.torch.compat import *  # noqa: F401,F403  (Horovod's names, see docs/torch.md)
from byteps.torch.compression import Compression
from byteps.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from byteps.torch.ops import (
    declare,
    init,
    is_initialized,
    local_rank,
    local_size,
    poll,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
    rank,
    shutdown,
    size,
    synchronize,
)
from byteps.torch.optimizer import DistributedOptimizer
from byteps.torch.qadam import QAdamOptimizer
from byteps.torch.sync_batch_norm import SyncBatchNorm

# The original BytePS API first; Horovod's names (allreduce, broadcast, allgather, ops, ...)
# are there so that a Horovod script needs only its import changed.
__all__ = [
    "BytePSError", "Compression", "DistributedOptimizer", "QAdamOptimizer",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "declare",
    "init", "is_initialized", "join", "local_rank", "local_size", "parallel", "poll",
    "push_pull", "push_pull_async", "push_pull_async_inplace", "push_pull_inplace", "rank",
    "shutdown", "size", "synchronize", "SyncBatchNorm",
] + list(_horovod_names)


def _suspend() -> None:
    """The original BytePS's ``suspend()``: byteps.torch's ``shutdown()`` until ``resume()``;
    ``rank()`` and ``size()`` still answer meanwhile."""
    from byteps.core import elastic
    elastic.suspend(shutdown)


def __getattr__(name):
    if name in ("parallel", "elastic"):        # bps.elastic.run, bps.elastic.TorchState
        import importlib
        return importlib.import_module(f"byteps.torch.{name}")
    if name == "suspend":          # the original BytePS's elastic calls
        return _suspend
    if name == "resume":
        from byteps.core import elastic
        return elastic.resume
    raise AttributeError(f"module 'byteps.torch' has no attribute {name!r}")

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)

from byteps.core import algorithms  # noqa: E402  (bps.algorithms.AsyncModelAverage, ...)

__all__ = list(__all__) + ["get_pushpull_speed", "algorithms"]

byteps_push_pull = push_pull_async_inplace     # the original's name for it (its optimizers')
__all__.append("byteps_push_pull")

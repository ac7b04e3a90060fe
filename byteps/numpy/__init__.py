"""byteps.numpy — the framework-free API (also for JAX users).

    import byteps.numpy as bps
    bps.init()
    avg = bps.push_pull(grad, name="grad.w")          # averaged across workers
    w = bps.broadcast(w, root_rank=0, name="w")

Horovod's collectives on numpy arrays (allreduce with op=Sum/Average/Min/Max/Product,
allgather, broadcast, reducescatter, alltoall, grouped and ``*_async`` forms) are in
:mod:`byteps.numpy.collectives` and exported here; see docs/numpy.md.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api as _api
from byteps.core.api import (BytePSError, declare, is_initialized, join, local_rank,
                             local_size, poll, rank, size)
from byteps.core.api.basics import init, shutdown
from byteps.core.api.basics import __all__ as _basics_names
from byteps.core.api.basics import *  # noqa: F401,F403  (build info, cross_rank, timeline)
from byteps.numpy import collectives as _coll
from byteps.numpy.collectives import __all__ as _coll_names
from byteps.numpy.collectives import *  # noqa: F401,F403  (Horovod's collectives)
from byteps.numpy.collectives import barrier, broadcast

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "declare", "push_pull", "push_pull_async", "poll", "synchronize", "broadcast",
           "barrier", "join", "BytePSError", "step_done", "DistributedOptimizer", "algorithms",
           "nccl_built", "cuda_built", "rocm_built", "set_compression_lr"] + \
    [n for n in _coll_names + _basics_names
     if n not in ("barrier", "broadcast", "global_only", "process_set_kw", "init", "shutdown")]

from byteps.core import algorithms  # noqa: E402
from byteps.numpy.optimizer import DistributedOptimizer  # noqa: E402


def push_pull(array, name: str, average: bool = True, priority: int = 0,
              compression_params: dict | None = None) -> np.ndarray:
    """Sum (or average) ``array`` across all workers; returns a new array.

    ``compression_params`` (e.g. ``{"compressor": "onebit", "ef": "vanilla"}``,
    see docs/compression.md) compresses the tensor on the wire; the first use of
    a name (or :func:`declare`) fixes its settings.

    With ``BYTEPS_ENABLE_ASYNC=1`` (asynchronous mode, as the original): the servers add
    ``array`` (a delta) to the value they hold for ``name`` and the result is their
    current global value (no averaging: ``average=True`` raises BytePSError; pass
    ``average=False``).  See docs/algorithms.md.
    """
    return _api.push_pull(np.asarray(array), name, average=average, priority=priority,
                          compression_params=compression_params, asynchronous=_async())


def push_pull_async(array, name: str, average: bool = True, priority: int = 0,
                    compression_params: dict | None = None) -> int:
    """Start a push_pull; returns a handle for :func:`poll` / :func:`synchronize`."""
    return _api.push_pull_async(np.asarray(array), name, average=average, priority=priority,
                                compression_params=compression_params,
                                asynchronous=_async())


def set_compression_lr(lr: float) -> None:
    """lr-aware error feedback (docs/compression.md): the learning rate of the coming step,
    before its push_pulls.  Error feedback then scales each residual by previous lr /
    current lr, as the torch, TensorFlow, Keras and MXNet optimizers do by themselves."""
    _api.set_compression_lr(float(lr))


def _async() -> bool:
    return _api.get_config().enable_async


def synchronize(handle: int) -> np.ndarray:
    """Wait for a handle and return the result array.

    The call that leaves nothing in flight ends a training step for the timeline's
    trace window, unless the script marks steps itself with :func:`step_done`."""
    try:
        res = _api.synchronize(handle)
    except BaseException:
        _coll.discard(handle)
        raise
    out = _coll.finish(handle, res)
    _api.step_done(implicit=True)
    return out


def step_done() -> None:
    """Mark the end of a training step (``BYTEPS_TRACE_START_STEP``/``END_STEP``)."""
    _api.step_done()


def nccl_built() -> bool:
    """False: numpy arrays live in host memory."""
    return False


def cuda_built() -> bool:
    """False: numpy arrays live in host memory."""
    return False


def rocm_built() -> bool:
    """False: numpy arrays live in host memory."""
    return False

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)

__all__ = list(__all__) + ["get_pushpull_speed"]

from byteps.numpy import elastic  # noqa: E402  (bps.elastic.run, NumpyState, ObjectState)
from byteps.core.elastic import resume, suspend  # noqa: E402  (the original's elastic calls)

__all__ = list(__all__) + ["elastic", "suspend", "resume"]

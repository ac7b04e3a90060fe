"""byteps.numpy — the framework-free API (also for JAX users).

    import byteps.numpy as bps
    bps.init()
    avg = bps.push_pull(grad, name="grad.w")          # averaged across workers
    w = bps.broadcast(w, root_rank=0, name="w")
"""
from __future__ import annotations

import numpy as np

from byteps.core import api as _api
from byteps.core.api import (BytePSError, barrier, declare, init, is_initialized, join,
                             local_rank, local_size, poll, rank, shutdown, size)

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "declare", "push_pull", "push_pull_async", "poll", "synchronize", "broadcast",
           "barrier", "join", "BytePSError", "step_done", "DistributedOptimizer", "algorithms"]

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


def _async() -> bool:
    return _api.get_config().enable_async


def synchronize(handle: int) -> np.ndarray:
    """Wait for a handle and return the result array.

    The call that leaves nothing in flight ends a training step for the timeline's
    trace window, unless the script marks steps itself with :func:`step_done`."""
    out = _api.synchronize(handle)
    _api.step_done(implicit=True)
    return out


def step_done() -> None:
    """Mark the end of a training step (``BYTEPS_TRACE_START_STEP``/``END_STEP``)."""
    _api.step_done()


def broadcast(array, root_rank: int, name: str | None = None) -> np.ndarray:
    """Return rank ``root_rank``'s array on every rank."""
    return _api.broadcast(np.asarray(array), root_rank, name=name)

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)

__all__ = list(__all__) + ["get_pushpull_speed"]

from byteps.numpy import elastic  # noqa: E402  (bps.elastic.run, NumpyState, ObjectState)
from byteps.core.elastic import resume, suspend  # noqa: E402  (the original's elastic calls)

__all__ = list(__all__) + ["elastic", "suspend", "resume"]

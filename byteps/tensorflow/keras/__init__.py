"""byteps.tensorflow.keras — BytePS for ``tf.keras`` (Keras 3, or tf-keras 2 under
``TF_USE_LEGACY_KERAS=1``); the same implementation as ``byteps.keras``.

    import byteps.tensorflow.keras as bps
    bps.init()
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.01 * bps.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                               bps.callbacks.MetricAverageCallback()])
"""
from __future__ import annotations

import tensorflow as _tf

from byteps import _keras as _impl
from byteps._keras.qadam import qadam_factory as _qadam_factory
from byteps.core.api import (
    BytePSError,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
)
from byteps.core.basics import init, shutdown
from byteps.tensorflow import (
    Adasum,
    Average,
    Compression,
    Sum,
    byteps_built,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)

keras = _tf.keras

from byteps.tensorflow.keras import callbacks  # noqa: E402  after `keras`: subclasses keras.callbacks.Callback

__all__ = [
    "Average",
    "Adasum",
    "BytePSError",
    "Compression",
    "DistributedOptimizer",
    "QAdamOptimizer",
    "Sum",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "callbacks",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "push_pull",
    "rank",
    "reducescatter",
    "shutdown",
    "size",
    # Horovod's build-info and host queries (byteps/core/basics.py)
    "byteps_built", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "gloo_built", "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rocm_built", "start_timeline", "stop_timeline",
]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average,
                         average_aggregated_gradients=False, compression_params=None,
                         algorithm=None):
    """Wrap a Keras optimizer so that gradients are averaged across workers before use.

    Works with ``model.compile``/``model.fit`` and with ``apply_gradients``.
    ``backward_passes_per_step=N`` sums N local gradients and communicates
    once per N steps (divided by N with ``average_aggregated_gradients``).
    ``compression_params`` (the original BytePS keys, docs/compression.md)
    compresses gradients in the core; with ``"momentum": "nesterov"`` the
    optimizer's momentum moves into the compressor.  ``algorithm``: a
    ``bps.algorithms`` instance (AsyncPS with ``BYTEPS_ENABLE_ASYNC=1``; docs/algorithms.md);
    call ``opt.finish()`` on every rank at the end.
    """
    return _impl.create_distributed_optimizer(
        _impl.keras_of(optimizer), optimizer, name, device_dense, device_sparse, compression,
        sparse_as_dense, op, backward_passes_per_step, average_aggregated_gradients,
        compression_params=compression_params, algorithm=algorithm)


QAdamOptimizer = _qadam_factory(keras)


def broadcast_global_variables(root_rank: int):
    """Broadcast the variables of every Keras model in this process (and its optimizer)."""
    return _impl.broadcast_global_variables(keras, root_rank)


def push_pull(value, name: str | None = None, average: bool = True):
    """Average (or sum) a tensor/array/number across workers; returns a numpy array."""
    return _impl.push_pull(keras, value, name, average)


def broadcast(value, root_rank: int, name: str | None = None):
    """Rank ``root_rank``'s value on every rank (a tensor when eager, as Horovod)."""
    return _impl.broadcast(keras, value, root_rank, name)


def allreduce(value, name: str | None = None, average=True, prescale_factor=1.0,
              postscale_factor=1.0, op=None, compression=Compression.none):
    """Horovod's ``allreduce`` of a value (default: average; ``op`` wins over ``average``);
    a tensor when eager."""
    return _impl.allreduce(keras, value, name, average, prescale_factor, postscale_factor, op,
                           compression)


def allgather(value, name: str | None = None):
    """Every worker's value concatenated along the first dimension (a tensor when eager)."""
    return _impl.allgather(keras, value, name)


def reducescatter(value, name: str | None = None, op=Average):
    """This worker's block of rows of the reduced value (Average or Sum)."""
    return _impl.reducescatter(keras, value, name, op)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Load a saved model; its optimizer comes back wrapped as a DistributedOptimizer."""
    return _impl.load_model(keras, filepath, custom_optimizers, custom_objects, compression)

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)
from byteps.core import algorithms  # noqa: E402  (bps.algorithms.AsyncPS, Decentralized, ...)

__all__ = list(__all__) + ["get_pushpull_speed", "algorithms"]

from byteps.keras import elastic  # noqa: E402  (bps.elastic.run, KerasState)

__all__ = list(__all__) + ["elastic"]

"""The two Keras front ends, ``byteps.keras`` and ``byteps.tensorflow.keras``, generated
from one definition (Horovod's ``_impl`` pattern: the Keras module is passed in).

:func:`populate` fills a front end's namespace with every name it exports: the optimizer
wrapper, QAdam, Horovod's collectives of :mod:`byteps.tensorflow` as Keras helpers
(a tensor when eager, its value in a TF1 graph), process sets, objects, barrier, join,
build information, callbacks (:func:`byteps._keras.callbacks.populate`) and elastic.
The front ends differ only in which Keras module they are bound to.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import byteps.tensorflow as _tf_bps
from byteps import _keras as _impl
from byteps.core import api as core

# names taken as they are from byteps.tensorflow (one definition: byteps.core)
_SHARED = [
    "Adasum", "Average", "BytePSError", "Compression", "Max", "Min", "Product", "ReduceOp",
    "Sum", "allgather_object", "barrier", "broadcast_object", "byteps_built", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "get_pushpull_speed",
    "gloo_built", "gloo_enabled", "init", "is_homogeneous", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rank", "rocm_built", "shutdown", "size", "start_timeline",
    "stop_timeline", "algorithms", "ProcessSet", "add_process_set", "global_process_set",
    "remove_process_set", "suspend", "resume",
]


def _eval(result):
    """Horovod's keras helpers: the tensor(s) when eager, their value in a TF1 graph."""
    if tf.executing_eagerly():
        return result
    sess = tf.compat.v1.get_default_session()
    if sess is None:                      # tf-keras keeps a session of its own
        sess = tf.compat.v1.keras.backend.get_session()
    return sess.run(result)


def _t(value):
    return value if isinstance(value, (tf.Tensor, tf.Variable)) else tf.constant(value)


def push_pull(value, name: str | None = None, average: bool = True):
    """Average (or sum) a tensor/array/number across workers; returns a numpy array."""
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if name is None:
        name = f"anon.{arr.dtype}.{'x'.join(map(str, arr.shape)) or 'scalar'}"
    res = core.push_pull(np.array(arr, order="C").reshape(-1), "KerasPushPull." + name,
                         average=average)
    return res.reshape(arr.shape)


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=_tf_bps.Compression.none, process_set=None):
    """Horovod's ``allreduce`` of a value (default: average; ``op`` wins over
    ``average``)."""
    return _eval(_tf_bps.allreduce(_t(value), average=None if op else average, op=op,
                                   prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor,
                                   compression=compression, name=name,
                                   process_set=process_set))


def grouped_allreduce(values, name=None, average=True, prescale_factor=1.0,
                      postscale_factor=1.0, op=None, compression=_tf_bps.Compression.none,
                      process_set=None):
    """``allreduce`` of every value of ``values`` in one operation (a list)."""
    return _eval(_tf_bps.grouped_allreduce([_t(v) for v in values],
                                           average=None if op else average, op=op,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor,
                                           compression=compression, name=name,
                                           process_set=process_set))


def allgather(value, name=None, process_set=None):
    """Every worker's value concatenated along the first dimension."""
    return _eval(_tf_bps.allgather(_t(value), name=name, process_set=process_set))


def grouped_allgather(values, name=None, process_set=None):
    """``allgather`` of every value of ``values`` in one operation (a list)."""
    return _eval(_tf_bps.grouped_allgather([_t(v) for v in values], name=name,
                                           process_set=process_set))


def broadcast(value, root_rank, name=None, process_set=None):
    """Rank ``root_rank``'s value on every worker."""
    return _eval(_tf_bps.broadcast(_t(value), root_rank, name=name, process_set=process_set))


def reducescatter(value, name=None, op=_tf_bps.Average, process_set=None):
    """This worker's block of rows of the reduced value (Average or Sum)."""
    return _eval(_tf_bps.reducescatter(_t(value), op=op, name=name, process_set=process_set))


def grouped_reducescatter(values, name=None, op=_tf_bps.Average, process_set=None):
    """``reducescatter`` of every value of ``values`` in one operation (a list)."""
    return _eval(_tf_bps.grouped_reducescatter([_t(v) for v in values], op=op, name=name,
                                               process_set=process_set))


def alltoall(value, splits=None, name=None, process_set=None):
    """Send ``splits[i]`` rows to worker ``i`` (equal parts without ``splits``); the rows
    received, and with ``splits`` also the received splits, as Horovod."""
    return _eval(_tf_bps.alltoall(_t(value), splits=splits, name=name,
                                  process_set=process_set))


_HELPERS = (push_pull, allreduce, grouped_allreduce, allgather, grouped_allgather, broadcast,
            reducescatter, grouped_reducescatter, alltoall)


def populate(ns: dict, keras) -> None:
    """Define the front end bound to ``keras`` in the module namespace ``ns`` (its
    ``globals()``), with ``__all__``.  ``keras`` is Keras 3, or tf-keras 2 when legacy
    Keras is requested."""
    from byteps._keras.qadam import qadam_factory
    compression_none = _tf_bps.Compression.none

    def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                             compression=compression_none, sparse_as_dense=False,
                             gradient_predivide_factor=1.0, op=_tf_bps.Average,
                             backward_passes_per_step=1, average_aggregated_gradients=False,
                             num_groups=0, groups=None, process_set=None,
                             scale_local_gradients=True, compression_params=None,
                             algorithm=None):
        """Wrap a Keras optimizer so that gradients are averaged across workers before use
        (among ``process_set``'s ranks only with Horovod's ``process_set=``; a rank outside
        the set applies its own gradients).

        Works with ``model.compile``/``model.fit`` and with ``apply_gradients``.
        ``backward_passes_per_step=N`` sums N local gradients and communicates once per N
        steps (divided by N with ``average_aggregated_gradients``).  ``compression_params``
        (the original BytePS keys, docs/compression.md) compresses gradients in the core,
        with error feedback scaled by the optimizer's learning rate; with
        ``"momentum": "nesterov"`` the optimizer's momentum moves into the compressor.
        ``algorithm``: a ``bps.algorithms`` instance (AsyncPS with
        ``BYTEPS_ENABLE_ASYNC=1``; docs/algorithms.md); call ``opt.finish()`` on every
        rank at the end.  ``opt.register_local_var(v)`` (Horovod's) keeps ``v``'s gradient
        on this worker, divided by the number of workers unless
        ``scale_local_gradients=False``.  Horovod's ``gradient_predivide_factor``,
        ``num_groups`` and ``groups`` are checked and accepted (the same average; byteps
        fuses small tensors itself).
        """
        from byteps.core.api.basics import check_gradient_grouping
        average = _tf_bps._ops.resolve_op(op, None) == _tf_bps._ops.Average
        check_gradient_grouping("DistributedOptimizer", gradient_predivide_factor, num_groups,
                                groups, average)
        return _impl.create_distributed_optimizer(
            _impl.keras_of(optimizer), optimizer, name, device_dense, device_sparse,
            compression, sparse_as_dense, op, backward_passes_per_step,
            average_aggregated_gradients, compression_params=compression_params,
            algorithm=algorithm, scale_local_gradients=scale_local_gradients,
            process_set=process_set)

    def PartialDistributedOptimizer(optimizer, local_layers=None, **kwargs):
        """Horovod's: a DistributedOptimizer (same keywords) whose ``local_layers`` (a
        Keras layer or a list of them) keep their gradients on each worker."""
        if local_layers is None:
            local_layers = []
        elif isinstance(local_layers, keras.layers.Layer):
            local_layers = [local_layers]
        bad = [type(x).__name__ for x in local_layers if not isinstance(x, keras.layers.Layer)]
        if bad:
            raise ValueError(f"PartialDistributedOptimizer: local_layers must be Keras layers "
                             f"of {keras.__name__}, got {bad}")
        opt = DistributedOptimizer(optimizer, **kwargs)
        for layer in local_layers:
            for var in layer.trainable_weights:
                opt.register_local_var(var)
        return opt

    def broadcast_global_variables(root_rank: int):
        """Broadcast the variables of every Keras model in this process (and their
        optimizers') from ``root_rank``."""
        return _impl.broadcast_global_variables(keras, root_rank)

    def load_model(filepath, custom_optimizers=None, custom_objects=None,
                   compression=compression_none):
        """Load a saved model; its optimizer comes back wrapped as a DistributedOptimizer."""
        return _impl.load_model(keras, filepath, custom_optimizers, custom_objects,
                                compression)

    module = ns["__name__"]
    made = {"keras": keras, "DistributedOptimizer": DistributedOptimizer,
            "PartialDistributedOptimizer": PartialDistributedOptimizer,
            "broadcast_global_variables": broadcast_global_variables,
            "load_model": load_model, "QAdamOptimizer": qadam_factory(keras)}
    made.update({f.__name__: f for f in _HELPERS})
    for n in _SHARED:
        if hasattr(_tf_bps, n):
            made[n] = getattr(_tf_bps, n)
    for f in (DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables,
              load_model,
              made["QAdamOptimizer"]):
        f.__module__, f.__qualname__ = module, f.__name__
    ns.update(made)
    ns["__all__"] = sorted(n for n in made if n != "keras") + ["callbacks", "elastic"]

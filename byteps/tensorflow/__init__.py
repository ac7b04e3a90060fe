"""byteps.tensorflow — BytePS for TensorFlow 2 (eager and ``tf.function``).

    import byteps.tensorflow as bps
    bps.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = bps.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged across workers
    opt.apply_gradients(zip(grads, model.trainable_variables))
    bps.broadcast_variables(model.variables, root_rank=0)     # after the first step

Tensors travel through the framework-free core (``byteps.core.api``) as
numpy arrays; inside ``tf.function`` that happens in ``tf.numpy_function``
ops, so XLA (``jit_compile=True``) cannot compile a step that communicates.
Horovod's collectives (``allreduce``, ``allgather``, ``broadcast``,
``reducescatter``, ``alltoall``, grouped forms, with gradients) are in
:mod:`byteps.tensorflow.mpi_ops`, so ``import byteps.tensorflow as hvd`` works.
"""
from __future__ import annotations

try:
    import tensorflow as tf
except ImportError as _exc:
    from byteps import missing_framework
    raise missing_framework("tensorflow", "tensorflow", "byteps.tensorflow", _exc) from _exc

from byteps.core.api import (
    BytePSError,
    is_initialized,
    join,
    local_rank,
    local_size,
    rank,
    size,
)
from byteps.core.api.basics import (
    shutdown,
    init,
    barrier,
    byteps_built,
    ccl_built,
    cross_rank,
    cross_size,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    start_timeline,
    stop_timeline,
)
from byteps.core.api.basics import __all__ as _basics_names
from byteps.core.api.basics import *  # noqa: F401,F403  (process sets, where the core has them)
from byteps.tensorflow import _ops, util  # noqa: F401  (hvd.util._executing_eagerly)
from byteps.core.collective.rules import is_adasum
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.functions import allgather_object, broadcast_object, broadcast_object_fn
from byteps.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape, finish
from byteps.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)
from byteps.tensorflow.util import _executing_eagerly  # noqa: F401  (Horovod has it here too)

__all__ = [
    "BroadcastGlobalVariablesHook", "BytePSError", "Compression", "DistributedGradientTape",
    "DistributedOptimizer",
    "PartialDistributedGradientTape", "SyncBatchNormalization",
    "QAdamOptimizer", "barrier", "broadcast_global_variables", "broadcast_variables", "finish",
    "init", "is_initialized", "join", "local_rank", "local_size", "push_pull", "rank", "shutdown",
    "size",
    # Horovod's names (byteps/tensorflow/mpi_ops.py, byteps/core/api/basics.py; docs/tensorflow.md)
    "Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum", "allgather",
    "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_", "broadcast_object",
    "broadcast_object_fn", "byteps_built", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "is_homogeneous",
    "local_rank_op", "local_size_op", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "process_set_included_op", "rank_op", "reducescatter", "rocm_built",
    "size_op", "start_timeline", "stop_timeline",
] + [n for n in _basics_names if n in ("ProcessSet", "add_process_set", "global_process_set",
                                       "remove_process_set")]


def _scoped(scope: str, name: str) -> str:
    return (scope.rstrip("/") + "/" if scope else "") + name


def push_pull(tensor, scope: str = "", average=None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op=None,
              name: str | None = None):
    """The original BytePS name of :func:`allreduce`: average (default) or sum ``tensor``
    over all workers (``op`` may also be Min, Max or Product); eager or in ``tf.function``.

    ``tf.IndexedSlices`` are gathered sparsely (values and indices of every rank,
    concatenated).  Without ``name`` the core numbers the call, so every rank must make
    its unnamed calls in the same order."""
    return allreduce(tensor, average=average, device_dense=device_dense,
                     device_sparse=device_sparse, compression=compression, op=op,
                     name=_scoped(scope, name) if name else None)


def nccl_built() -> bool:
    """False: byteps moves TensorFlow tensors through host memory, not NCCL."""
    return False


def cuda_built() -> bool:
    """True when this TensorFlow is built with CUDA (GPU tensors are staged through host
    memory)."""
    return bool(tf.test.is_built_with_cuda())


def rocm_built() -> bool:
    """True when this TensorFlow is built with ROCm."""
    return bool(tf.test.is_built_with_rocm())


def broadcast_variables(variables, root_rank: int, scope: str = "", process_set=None):
    """Assign rank ``root_rank``'s value to every variable on every rank (of
    ``process_set``, Horovod's: its members call it, ``root_rank`` one of them).

    Eagerly this happens at once (returns None); inside ``tf.function`` or a
    TF1 graph it returns the op that does it.  Every rank must pass the same
    variables (checked: a mismatch raises instead of hanging).
    """
    variables = list(variables)
    names = _ops.unique_names("BroadcastVariables." + _scoped(scope, ""), variables)
    ps = _ops.gradient_process_set(process_set)
    if ps is None:
        values = _ops.broadcast_tensors([tf.convert_to_tensor(v) for v in variables], names,
                                        root_rank)
    else:
        values = [broadcast(tf.convert_to_tensor(v), root_rank, name=n, process_set=ps)
                  for v, n in zip(variables, names)]
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_global_variables(root_rank: int):
    """Broadcast all TF1 global variables (graph mode only).

    TensorFlow 2 has no global variable collection: use
    ``broadcast_variables(model.variables, root_rank)`` (and the optimizer's
    variables), or ``byteps.keras.broadcast_global_variables``.
    """
    if tf.executing_eagerly():
        raise BytePSError("bps.broadcast_global_variables() needs a TF1 graph: TensorFlow 2 "
                          "eager mode has no global variables. Use "
                          "bps.broadcast_variables(model.variables, root_rank) and "
                          "bps.broadcast_variables(optimizer.variables, root_rank), or the "
                          "Keras BroadcastGlobalVariablesCallback")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast every global variable from ``root_rank`` once a TF1 session is created
    (``tf.compat.v1.train.MonitoredTrainingSession(hooks=[...])``): consistent start from
    random weights or a checkpoint restored on one rank.  The original BytePS's and
    Horovod's hook; ``device`` places the broadcast op."""

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        self.root_rank, self.device, self.bcast_op = root_rank, device, None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def QAdamOptimizer(learning_rate=0.001, warmup_steps=100, **kwargs):
    """QAdam / 1-bit Adam for Keras 3 and tf-keras 2 (see byteps.keras.QAdamOptimizer); use
    it through DistributedOptimizer or DistributedGradientTape(optimizer=...)."""
    from byteps import _keras
    from byteps._keras.qadam import qadam_class
    return qadam_class(_keras.default_keras())(learning_rate=learning_rate,
                                                warmup_steps=warmup_steps, **kwargs)


def DistributedOptimizer(optimizer, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op=Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups=None, process_set=None, scale_local_gradients: bool = True,
                         compression_params: dict | None = None, algorithm=None):
    """Wrap an optimizer so that it averages gradients across workers before applying them
    (among ``process_set``'s ranks only with Horovod's ``process_set=``; a rank outside the
    set applies its own gradients).

    Keras optimizers (Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``)
    get the shared Keras implementation (``byteps.keras.DistributedOptimizer``);
    ``tf.compat.v1.train.Optimizer`` instances are wrapped by delegation.
    ``compression_params`` (the original BytePS keys, docs/compression.md)
    compresses gradients in the core.  ``algorithm`` (Keras optimizers): a
    ``bps.algorithms`` instance; AsyncPS with ``BYTEPS_ENABLE_ASYNC=1`` (docs/algorithms.md).
    Horovod's ``gradient_predivide_factor``, ``num_groups`` and ``groups`` are checked and
    accepted (:func:`byteps.core.api.basics.check_gradient_grouping`).
    """
    given, op = op, _ops.resolve_op(op, None)    # op=Adasum: the Adasum algorithm (Keras)
    from byteps.core.api.basics import check_gradient_grouping
    check_gradient_grouping("DistributedOptimizer", gradient_predivide_factor, num_groups,
                            groups, op == _ops.Average)
    from byteps.tensorflow.compression import with_params
    compression = with_params(compression, compression_params)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from byteps._keras.algorithm import refuse_v1
        refuse_v1(algorithm, optimizer)
        if is_adasum(given):
            from byteps.core import compat
            compat.refuse("adasum-v1-optimizer", f"DistributedOptimizer("
                                                 f"{type(optimizer).__name__}, op=Adasum)")
        from byteps.tensorflow._v1 import wrap_v1_optimizer
        return wrap_v1_optimizer(optimizer, name, use_locking, device_dense, device_sparse,
                                 compression, sparse_as_dense, backward_passes_per_step, op,
                                 process_set)
    from byteps import _keras
    return _keras.create_distributed_optimizer(
        _keras.keras_of(optimizer), optimizer, name, device_dense, device_sparse, compression,
        sparse_as_dense, given, backward_passes_per_step, average_aggregated_gradients,
        algorithm=algorithm, process_set=process_set,
        scale_local_gradients=scale_local_gradients)

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)
from byteps.core import algorithms  # noqa: E402  (bps.algorithms.AsyncPS, Decentralized, ...)

__all__ = list(__all__) + ["get_pushpull_speed", "algorithms"]

from byteps.tensorflow import elastic  # noqa: E402  (bps.elastic.run, TensorFlowKerasState)

__all__ = list(__all__) + ["elastic"]

from byteps.core.elastic import resume, suspend  # noqa: E402  (the original's elastic calls)

__all__ = list(__all__) + ["suspend", "resume"]


def __getattr__(name: str):
    """``SyncBatchNormalization`` is built on first use (it imports Keras)."""
    if name == "SyncBatchNormalization":
        from byteps.tensorflow.sync_batch_norm import sync_batch_norm_class
        return sync_batch_norm_class()
    raise AttributeError(f"module 'byteps.tensorflow' has no attribute {name!r}")

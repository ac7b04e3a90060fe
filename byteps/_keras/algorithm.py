"""Training algorithms (byteps/core/algorithms, docs/algorithms.md) for Keras optimizers
(``byteps.keras``, ``byteps.tensorflow``, ``byteps.tensorflow.keras``).

With an algorithm other than SyncPS (``BYTEPS_ENABLE_ASYNC=1`` selects AsyncPS, the
original's asynchronous mode) the wrapped optimizer applies its *local* gradients, then
hands the variables to the core algorithm as numpy arrays (``after_step``: AsyncPS pushes
the change since its last pull and pulls the servers' parameters) and assigns the result
back.  The first ``apply`` first runs ``init`` (AsyncPS: rank 0's values seed the servers
and every rank pulls them).  Inside ``tf.function`` (``model.fit``) both run in
``tf.py_function`` ops with explicit dependencies: the update waits for ``init``, and
``after_step`` receives the variables' values read after the update.
``optimizer.finish()`` is the algorithm's final exchange (every rank).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from byteps.core import algorithms as _algorithms
from byteps.core import api as core
from byteps.core.collective import rules as _rules
from byteps.tensorflow import _ops


def resolve(algorithm, settings, op=None):
    """A :class:`KerasAlgorithm` for a non-SyncPS algorithm (or the default one with
    ``BYTEPS_ENABLE_ASYNC=1``; ``op=Adasum``: Adasum); None when the plugin's gradient
    exchange applies."""
    if algorithm is None and not _rules.is_adasum(op):
        if not (core.is_initialized() and core.get_config().enable_async):
            return None
    algorithm = _algorithms.resolve(algorithm, "DistributedOptimizer", op)
    if algorithm.plugin_gradients:
        return None
    what = f"{algorithm.describe()} with a Keras optimizer"
    if _algorithms.wants(algorithm, "reduce_gradients"):
        raise core.BytePSError(f"{what}: algorithms that combine gradients "
                               f"(reduce_gradients) are not available in byteps.keras; "
                               f"combine parameters in after_step instead")
    # the core's one rule: the algorithm receives the compressor and the backward passes
    algorithm.bind(getattr(settings.compression, "core_params", None) or None, settings.passes,
                   subject=what)
    return KerasAlgorithm(algorithm, settings.prefix)


class KerasAlgorithm:
    """Runs a core algorithm on a Keras optimizer's variables."""

    def __init__(self, algorithm, prefix: str):
        self.algorithm = algorithm
        self.prefix = prefix
        self.names: list[str] | None = None
        self.variables: list = []

    def _arrays(self, variables) -> dict:
        return {n: np.array(v.numpy(), order="C", copy=True)
                for n, v in zip(self.names, variables)}

    def _write(self, variables, arrs: dict) -> None:
        for n, v in zip(self.names, variables):
            v.assign(arrs[n])

    def _init(self, variables) -> int:
        """``init`` on the first call; on every call, ``before_step`` where the algorithm
        has one (Adasum: the values this step starts from)."""
        if self.names is None:
            self.names = [n[len(self.prefix):] for n in _ops.unique_names(self.prefix,
                                                                           variables)]
            self.variables = list(variables)
            arrs = self._arrays(variables)
            self.algorithm.init(arrs)
            self._write(variables, arrs)
        if _algorithms.wants(self.algorithm, "before_step"):
            self.algorithm.before_step(self._arrays(variables))
        return 0

    def _after(self, variables, values=None) -> int:
        if values is None:
            arrs = self._arrays(variables)
        else:                     # the values read after the update (tf.function)
            arrs = {n: np.array(v.numpy(), order="C", copy=True)
                    for n, v in zip(self.names, values)}
        self.algorithm.after_step(arrs)
        self._write(variables, arrs)
        core.step_done()
        return 0

    def apply(self, variables, apply_fn):
        """``init`` on the first call, the local step ``apply_fn()``, then ``after_step``.

        In a graph the order is explicit: the update depends on the ``init`` op, and the
        ``after_step`` op takes the variables' values read after the update (reads are
        ordered after the writes of the same variable), not the variables themselves."""
        variables = list(variables)
        if tf.executing_eagerly():
            self._init(variables)
            out = apply_fn()
            self._after(variables)
            return out
        pre = tf.py_function(lambda: np.int32(self._init(variables)), [], tf.int32)
        with tf.control_dependencies([pre]):
            out = apply_fn()
        deps = [d for d in tf.nest.flatten(out) if isinstance(d, (tf.Tensor, tf.Operation))]
        with tf.control_dependencies(deps):
            values = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        tf.py_function(lambda *vals: np.int32(self._after(variables, vals)), values,
                       tf.int32)
        return out

    def finish(self) -> None:
        """The algorithm's final exchange (eagerly, every rank): identical parameters."""
        if self.names is None:
            return
        arrs = self._arrays(self.variables)
        self.algorithm.finish(arrs)
        self._write(self.variables, arrs)


def refuse_v1(algorithm, optimizer) -> None:
    """tf.compat.v1 optimizers average gradients in graph ops only: a clear error for an
    algorithm (or BYTEPS_ENABLE_ASYNC=1) instead of silently synchronous training."""
    wants = algorithm is not None and not getattr(algorithm, "plugin_gradients", False)
    if algorithm is None and core.is_initialized() and core.get_config().enable_async:
        wants = True
    if wants:
        raise core.BytePSError(
            f"{type(optimizer).__name__} (tf.compat.v1.train.Optimizer): training algorithms "
            f"other than SyncPS (including BYTEPS_ENABLE_ASYNC=1) need a Keras optimizer "
            f"(tf.keras.optimizers.*) wrapped by bps.DistributedOptimizer; or unset "
            f"BYTEPS_ENABLE_ASYNC")

"""DistributedOptimizer for ``tf.compat.v1.train.Optimizer`` (wrapped by delegation)."""
from __future__ import annotations

import tensorflow as tf

from byteps.tensorflow import _ops


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """Averages gradients across workers in ``compute_gradients``; the rest is delegated."""

    def __init__(self, optimizer, name, use_locking, device_dense, device_sparse, compression,
                 sparse_as_dense, op, process_set=None):
        name = name or "Distributed" + type(optimizer).__name__
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._bps = (name + ".Push_Pull.", compression, sparse_as_dense, op, device_dense,
                     device_sparse)
        self._bps_process_set = process_set

    def compute_gradients(self, *args, **kwargs):
        """Compute gradients with the wrapped optimizer, then push_pull them."""
        gv = list(self._optimizer.compute_gradients(*args, **kwargs))
        variables = [v for _, v in gv]
        prefix, comp, sad, op, dd, ds = self._bps
        grads = _ops.push_pull_grads([g for g, _ in gv], variables, prefix, comp, sad, op, dd, ds,
                                     process_set=self._bps_process_set)
        return list(zip(grads, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def wrap_v1_optimizer(optimizer, name, use_locking, device_dense, device_sparse, compression,
                      sparse_as_dense, backward_passes_per_step, op, process_set=None):
    if backward_passes_per_step != 1:
        raise ValueError(f"DistributedOptimizer({type(optimizer).__name__}): "
                         f"backward_passes_per_step={backward_passes_per_step} is supported for "
                         f"Keras optimizers only; aggregate tf.compat.v1 gradients yourself or "
                         f"use a tf.keras optimizer")
    return _DistributedV1Optimizer(optimizer, name, use_locking, device_dense, device_sparse,
                                   compression, sparse_as_dense, op,
                                   _ops.gradient_process_set(process_set))

"""Horovod's ``SyncBatchNormalization`` for Keras 3 and tf-keras 2: batch statistics summed
over every worker while training (``hvd.SyncBatchNormalization``, built on first use so
that importing byteps.tensorflow does not import Keras)."""
from __future__ import annotations

import tensorflow as tf

_CLASS = None


def sync_batch_norm_class():
    """The ``SyncBatchNormalization`` class over the Keras that ``tf.keras`` names."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build(tf.keras.layers.BatchNormalization)
    return _CLASS


def _build(base):
    from byteps.core import api as core
    from byteps.tensorflow.mpi_ops import Sum, allreduce
    import inspect
    takes_fused = "fused" in inspect.signature(base.__init__).parameters

    class SyncBatchNormalization(base):
        """Synchronous batch normalization: while training, the mean and variance are the
        whole job's (every worker's batch equally weighted, as Horovod).  ``fused`` must be
        False (Keras 3 has no fused kernel and takes no such argument)."""

        def __init__(self, fused=False, **kwargs):
            if fused in (True, None):
                raise ValueError("SyncBatchNormalization does not support fused=True")
            if not kwargs.get("name"):
                kwargs["name"] = "sync_batch_normalization"
            if takes_fused:
                kwargs["fused"] = fused
            super().__init__(**kwargs)

        def _moments(self, inputs, *args, **kwargs):
            mean, variance = super()._moments(inputs, *args, **kwargs)
            n = core.size()
            if n == 1:
                return mean, variance
            # Var[X] = E[X^2] - E[X]^2, with both expectations averaged over the workers
            stack = tf.stack([mean, variance + tf.math.square(mean)])
            group = allreduce(stack, op=Sum) / tf.cast(n, stack.dtype)
            g_mean, g_square = tf.unstack(group)
            return g_mean, g_square - tf.math.square(g_mean)

        def call(self, inputs, training=None, mask=None):   # Keras 3 reads these names
            outputs = super().call(inputs, training=training, mask=mask)
            try:   # TF1 graphs: the moving averages' updates in UPDATE_OPS, as Horovod
                for u in self.updates:
                    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, u)
            except (AttributeError, ValueError):
                pass
            return outputs

    return SyncBatchNormalization

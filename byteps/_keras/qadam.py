"""QAdam / 1-bit Adam for Keras 3 (``byteps.keras.QAdamOptimizer``), as in byteps.torch.

    opt = bps.DistributedOptimizer(bps.QAdamOptimizer(learning_rate=1e-3, warmup_steps=100))

Adam on the averaged full-precision gradients for ``warmup_steps`` steps; then the
variance is frozen and each worker's first moment ``m = b1 m + (1 - b1) g`` is what
the workers average, compressed in the core (``compression_params``, default onebit
+ error feedback).  The switch happens inside the step (``tf.cond`` on the
optimizer's ``iterations``), so it works in ``model.fit``'s ``tf.function``.
Elements whose frozen variance is 0 are not moved by the compressed momentum.
"""
from __future__ import annotations

import tensorflow as tf

DEFAULT_COMPRESSION = {"compressor": "onebit", "ef": "vanilla"}
_CLASSES: dict = {}


def qadam_class(keras):
    """The QAdamOptimizer class for this Keras 3 module (made once)."""
    cls = _CLASSES.get(keras)
    if cls is not None:
        return cls
    if not hasattr(keras.optimizers.Optimizer, "stateless_apply"):
        raise NotImplementedError("QAdamOptimizer needs Keras 3 (tf-keras 2 under "
                                  "TF_USE_LEGACY_KERAS=1 is not supported); use Keras 3 or "
                                  "byteps.torch.QAdamOptimizer")
    ops = keras.ops

    class QAdamOptimizer(keras.optimizers.Optimizer):
        """Adam whose momentum, after ``warmup_steps``, is exchanged compressed."""

        def __init__(self, learning_rate=0.001, warmup_steps=100, beta_1=0.9, beta_2=0.999,
                     epsilon=1e-7, compression_params=None, name="QAdam", **kwargs):
            if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) \
                    or warmup_steps < 1:
                raise ValueError(f"QAdamOptimizer: warmup_steps must be an int >= 1, got "
                                 f"{warmup_steps!r}")
            super().__init__(learning_rate=learning_rate, name=name, **kwargs)
            self.warmup_steps, self.beta_1, self.beta_2 = warmup_steps, beta_1, beta_2
            self.epsilon = epsilon
            self.compression_params = dict(compression_params or DEFAULT_COMPRESSION)
            from byteps import compression
            compression.parse(self.compression_params)

        def build(self, var_list):
            if self.built:
                return
            super().build(var_list)
            self._m = [self.add_variable_from_reference(v, "momentum") for v in var_list]
            self._v = [self.add_variable_from_reference(v, "velocity") for v in var_list]

        def _bps_exchange(self, grads, variables, settings):
            """DistributedOptimizer's hook: gradients during warm-up, then local momenta."""
            idx = [self._get_variable_index(v) for v in variables]

            def warm():
                return settings.reduce(grads, variables)

            def frozen():
                moms = [None if g is None else
                        self.beta_1 * self._m[i] + (1 - self.beta_1) * tf.cast(g, self._m[i].dtype)
                        for g, i in zip(grads, idx)]
                from byteps.tensorflow.compression import CoreCompressor
                return _reduce_with(settings, moms, variables, "QAdam.exp_avg.",
                                    CoreCompressor(self.compression_params))
            if tf.executing_eagerly():
                return warm() if int(self.iterations) < self.warmup_steps else frozen()
            return tf.cond(self.iterations < self.warmup_steps, warm, frozen)

        def update_step(self, gradient, variable, learning_rate):
            i = self._get_variable_index(variable)
            m, v = self._m[i], self._v[i]
            lr = ops.cast(learning_rate, variable.dtype)
            g = ops.cast(gradient, variable.dtype)
            step = ops.cast(self.iterations + 1, variable.dtype)
            warm = step <= self.warmup_steps
            # warm-up: Adam on the averaged gradient; after: the averaged momentum arrives
            self.assign(m, ops.where(warm, self.beta_1 * m + (1 - self.beta_1) * g, g))
            self.assign(v, ops.where(warm, self.beta_2 * v + (1 - self.beta_2) * g * g, v))
            self.assign(m, ops.where(ops.equal(v, 0), ops.zeros_like(m), m))
            bc1 = 1 - ops.power(ops.cast(self.beta_1, variable.dtype), step)
            bc2 = 1 - ops.power(ops.cast(self.beta_2, variable.dtype),
                                ops.minimum(step, float(self.warmup_steps)))
            self.assign_sub(variable, lr / bc1 * m / (ops.sqrt(v / bc2) + self.epsilon))

        def get_config(self):
            config = super().get_config()
            config.update(warmup_steps=self.warmup_steps, beta_1=self.beta_1,
                          beta_2=self.beta_2, epsilon=self.epsilon,
                          compression_params=self.compression_params)
            return config

    _CLASSES[keras] = QAdamOptimizer
    return QAdamOptimizer


def qadam_factory(keras):
    """``QAdamOptimizer(learning_rate, warmup_steps, **kwargs)`` for a plugin module bound
    to ``keras`` (the class is made on first use, so tf-keras fails only when called)."""
    def QAdamOptimizer(learning_rate=0.001, warmup_steps=100, **kwargs):
        """QAdam / 1-bit Adam (Keras 3): Adam for ``warmup_steps``, then the variance is
        frozen and the momentum is exchanged compressed (default onebit + error feedback);
        wrap it in DistributedOptimizer.  Other arguments: ``beta_1``, ``beta_2``,
        ``epsilon``, ``compression_params``.  See docs/compression.md."""
        return qadam_class(keras)(learning_rate=learning_rate, warmup_steps=warmup_steps,
                                  **kwargs)
    return QAdamOptimizer


def _reduce_with(settings, tensors, variables, prefix, compression):
    from byteps.tensorflow import _ops
    return _ops.push_pull_grads(tensors, variables, settings.prefix + prefix, compression,
                                settings.sparse_as_dense, settings.op, settings.device_dense,
                                settings.device_sparse)

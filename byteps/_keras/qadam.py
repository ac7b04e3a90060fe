"""QAdam / 1-bit Adam for Keras 3 and tf-keras 2 (``byteps.keras.QAdamOptimizer``), as in
byteps.torch.

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
    """The QAdamOptimizer class for this Keras module (Keras 3 or tf-keras 2; made once)."""
    cls = _CLASSES.get(keras)
    if cls is None:
        make = _keras3 if hasattr(keras.optimizers.Optimizer, "stateless_apply") else _keras2
        cls = _CLASSES[keras] = make(keras)
    return cls


def _check(warmup_steps, compression_params) -> dict:
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise ValueError(f"QAdamOptimizer: warmup_steps must be an int >= 1, got "
                         f"{warmup_steps!r}")
    params = dict(compression_params or DEFAULT_COMPRESSION)
    from byteps import compression
    compression.parse(params)
    return params


def _exchange(opt, grads, variables, settings):
    """DistributedOptimizer's and DistributedGradientTape's hook: gradients during
    warm-up, then local momenta (the moments exist first: a tape meets an unbuilt QAdam)."""
    if not (getattr(opt, "built", False) or getattr(opt, "_built", False)):
        with tf.init_scope():
            opt.build(variables)
    idx = [opt._bps_index(v) for v in variables]

    def warm():
        return settings.reduce(grads, variables)

    def frozen():
        moms = [None if g is None else
                opt.beta_1 * tf.convert_to_tensor(opt._m[i])
                + (1 - opt.beta_1) * tf.cast(g, opt._m[i].dtype)
                for g, i in zip(grads, idx)]
        from byteps.tensorflow.compression import CoreCompressor
        return _reduce_with(settings, moms, variables, "QAdam.exp_avg.",
                            CoreCompressor(opt.compression_params))
    if tf.executing_eagerly():
        return warm() if int(opt.iterations) < opt.warmup_steps else frozen()
    return tf.cond(opt.iterations < opt.warmup_steps, warm, frozen)


def _update(opt, gradient, variable, learning_rate, m, v, assign, assign_sub):
    """One QAdam step of ``variable`` (``gradient``: the averaged gradient during warm-up,
    the averaged momentum after)."""
    dt = variable.dtype
    lr, g = tf.cast(learning_rate, dt), tf.cast(gradient, dt)
    m_, v_ = tf.convert_to_tensor(m), tf.convert_to_tensor(v)
    step = tf.cast(opt.iterations + 1, dt)
    warm = step <= opt.warmup_steps
    # warm-up: Adam on the averaged gradient; after: the averaged momentum arrives
    m_ = tf.where(warm, opt.beta_1 * m_ + (1 - opt.beta_1) * g, g)
    v_ = tf.where(warm, opt.beta_2 * v_ + (1 - opt.beta_2) * g * g, v_)
    m_ = tf.where(tf.equal(v_, 0), tf.zeros_like(m_), m_)
    assign(m, m_)
    assign(v, v_)
    bc1 = 1 - tf.pow(tf.cast(opt.beta_1, dt), step)
    bc2 = 1 - tf.pow(tf.cast(opt.beta_2, dt), tf.minimum(step, float(opt.warmup_steps)))
    assign_sub(variable, lr / bc1 * m_ / (tf.sqrt(v_ / bc2) + opt.epsilon))


def _config(opt, config: dict) -> dict:
    config.update(warmup_steps=opt.warmup_steps, beta_1=opt.beta_1, beta_2=opt.beta_2,
                  epsilon=opt.epsilon, compression_params=opt.compression_params)
    return config


_DOC = "Adam whose momentum, after ``warmup_steps``, is exchanged compressed."


def _keras3(keras):
    class QAdamOptimizer(keras.optimizers.Optimizer):
        __doc__ = _DOC

        def __init__(self, learning_rate=0.001, warmup_steps=100, beta_1=0.9, beta_2=0.999,
                     epsilon=1e-7, compression_params=None, name="QAdam", **kwargs):
            params = _check(warmup_steps, compression_params)
            super().__init__(learning_rate=learning_rate, name=name, **kwargs)
            self.warmup_steps, self.beta_1, self.beta_2 = warmup_steps, beta_1, beta_2
            self.epsilon, self.compression_params = epsilon, params

        def build(self, var_list):
            if self.built:
                return
            super().build(var_list)
            self._m = [self.add_variable_from_reference(v, "momentum") for v in var_list]
            self._v = [self.add_variable_from_reference(v, "velocity") for v in var_list]

        def _bps_index(self, variable) -> int:
            return self._get_variable_index(variable)

        def _bps_exchange(self, grads, variables, settings):
            return _exchange(self, grads, variables, settings)

        def update_step(self, gradient, variable, learning_rate):
            i = self._bps_index(variable)
            _update(self, gradient, variable, learning_rate, self._m[i], self._v[i],
                    self.assign, self.assign_sub)

        def get_config(self):
            return _config(self, super().get_config())
    return QAdamOptimizer


def _keras2(keras):
    class QAdamOptimizer(keras.optimizers.Optimizer):
        __doc__ = _DOC

        def __init__(self, learning_rate=0.001, warmup_steps=100, beta_1=0.9, beta_2=0.999,
                     epsilon=1e-7, compression_params=None, name="QAdam", **kwargs):
            params = _check(warmup_steps, compression_params)
            kwargs.setdefault("jit_compile", False)   # the exchange runs in numpy ops
            super().__init__(name=name, **kwargs)
            self._learning_rate = self._build_learning_rate(learning_rate)
            self.warmup_steps, self.beta_1, self.beta_2 = warmup_steps, beta_1, beta_2
            self.epsilon, self.compression_params = epsilon, params

        def build(self, var_list):
            super().build(var_list)
            if getattr(self, "_built", False):
                return
            self._built = True
            self._m = [self.add_variable_from_reference(model_variable=v, variable_name="m")
                       for v in var_list]
            self._v = [self.add_variable_from_reference(model_variable=v, variable_name="v")
                       for v in var_list]

        def _bps_index(self, variable) -> int:
            return self._index_dict[self._var_key(variable)]

        def _bps_exchange(self, grads, variables, settings):
            return _exchange(self, grads, variables, settings)

        def update_step(self, gradient, variable):
            i = self._bps_index(variable)
            _update(self, gradient, variable, self.learning_rate, self._m[i], self._v[i],
                    lambda a, x: a.assign(x), lambda a, x: a.assign_sub(x))

        def get_config(self):
            config = super().get_config()
            config["learning_rate"] = self._serialize_hyperparameter(self._learning_rate)
            return _config(self, config)
    return QAdamOptimizer


def qadam_factory(keras):
    """``QAdamOptimizer(learning_rate, warmup_steps, **kwargs)`` for a plugin module bound
    to ``keras`` (the class is made on first use)."""
    def QAdamOptimizer(learning_rate=0.001, warmup_steps=100, **kwargs):
        """QAdam / 1-bit Adam (Keras 3 or tf-keras 2): Adam for ``warmup_steps``, then the
        variance is frozen and the momentum is exchanged compressed (default onebit + error
        feedback); wrap it in DistributedOptimizer, or pass it to
        ``DistributedGradientTape(optimizer=)``.  Other arguments: ``beta_1``, ``beta_2``,
        ``epsilon``, ``compression_params``.  See docs/compression.md."""
        return qadam_class(keras)(learning_rate=learning_rate, warmup_steps=warmup_steps,
                                  **kwargs)
    return QAdamOptimizer


def _reduce_with(settings, tensors, variables, prefix, compression):
    from byteps.tensorflow import _ops
    return _ops.push_pull_grads(tensors, variables, settings.prefix + prefix, compression,
                                settings.sparse_as_dense, settings.op, settings.device_dense,
                                settings.device_sparse, process_set=settings.process_set)

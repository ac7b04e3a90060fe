"""Shared implementation of ``byteps.keras`` and ``byteps.tensorflow.keras``.

The Keras module (Keras 3, or tf-keras 2 under ``TF_USE_LEGACY_KERAS=1``)
is passed in, Horovod style.  Keras 3 optimizers are hooked in ``apply()``
(``apply_gradients`` calls it); Keras 2 optimizers in ``apply_gradients()``.
Keras 3 must run on the TensorFlow backend.
"""
from __future__ import annotations

import gc
import os
import warnings

import numpy as np
import tensorflow as tf

from byteps.core import api as core
from byteps.tensorflow import _ops
from byteps.tensorflow.compression import Compression


def legacy_keras_requested() -> bool:
    return os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True")


def default_keras():
    """The Keras that ``tf.keras`` means in this process (tf-keras when legacy is requested)."""
    if legacy_keras_requested():
        import tf_keras
        return tf_keras
    import keras
    return keras


def keras_of(obj):
    """The Keras module an optimizer/model instance belongs to."""
    if type(obj).__module__.split(".")[0] == "tf_keras":
        import tf_keras
        return tf_keras
    import keras
    return keras


def _check_backend(keras) -> None:
    backend = getattr(getattr(keras, "backend", None), "backend", lambda: "tensorflow")()
    if backend != "tensorflow":
        raise RuntimeError(f"byteps.keras needs the TensorFlow Keras backend, but "
                           f"KERAS_BACKEND={backend!r}; use byteps.torch for the torch backend")


def optimizer_variables(opt) -> list:
    """An optimizer's variables: a property in Keras 3, a method in tf-keras legacy."""
    if opt is None:
        return []
    v = opt.variables
    return list(v() if callable(v) else v)


class _Settings:
    """Per-optimizer byteps settings (a plain object: invisible to Keras/TF tracking)."""

    def __init__(self, prefix, compression, sparse_as_dense, op, device_dense, device_sparse,
                 passes, average_aggregated):
        self.prefix, self.compression, self.sparse_as_dense = prefix, compression, sparse_as_dense
        self.op, self.device_dense, self.device_sparse = op, device_dense, device_sparse
        self.passes, self.average_aggregated = int(passes), average_aggregated
        self.counter, self.accs = None, None
        self.local: dict = {}       # id -> variable whose gradient stays local (Horovod's)
        self.scale_local = True     # ... divided by the number of workers
        self.reduced = None         # gradients _compute_gradients reduced already
        self.alg = None           # byteps._keras.algorithm.KerasAlgorithm (non-SyncPS)
        self.variables: list = []  # SyncPS: the variables of the latest step (finish())
        self.process_set = None    # Horovod's process_set= (None: every worker)
        if self.passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")

    def reduce(self, grads: list, variables: list) -> list:
        """Average ``grads`` across workers, except those of the local variables, which are
        divided by the number of workers (Horovod's ``scale_local_gradients``); gradients
        that ``_compute_gradients`` returned reduced already pass through."""
        done, self.reduced = self.reduced, None
        if done is not None and len(done) == len(grads) and \
                all(a is b for a, b in zip(done, grads)):
            return list(grads)
        shared = [i for i, v in enumerate(variables) if id(v) not in self.local]
        out = list(grads)
        red = _ops.push_pull_grads([grads[i] for i in shared], [variables[i] for i in shared],
                                   self.prefix, self.compression, self.sparse_as_dense,
                                   self.op, self.device_dense, self.device_sparse,
                                   process_set=self.process_set)
        for i, g in zip(shared, red):
            out[i] = g
        if self.scale_local and len(shared) < len(out):
            n = float(_ops.reducing_size(self.process_set))
            for i, v in enumerate(variables):
                if id(v) in self.local and out[i] is not None:
                    out[i] = _scaled(out[i], 1.0 / n)
        return out

    def aggregate(self, grads: list, variables: list, apply_fn, iterations=None) -> None:
        """Sum gradients locally; every ``passes`` calls push_pull the sum and apply it.  The
        other calls advance ``iterations`` only (Horovod: it counts backward passes)."""
        with tf.init_scope():
            if self.accs is None:
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="bps_backward_passes")
                self.accs = [None if g is None else
                             tf.Variable(tf.zeros(tuple(v.shape), g.dtype), trainable=False,
                                         name="bps_grad_accumulator")
                             for g, v in zip(grads, variables)]
        if len(self.accs) != len(grads):
            raise ValueError(f"{self.prefix}: backward_passes_per_step needs the same variable "
                             f"list every step ({len(self.accs)} before, {len(grads)} now)")
        for acc, g in zip(self.accs, grads):
            if acc is not None and g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        count = self.counter.assign_add(1)

        def flush():
            total = [None if a is None else
                     (a.read_value() / self.passes if self.average_aggregated else a.read_value())
                     for a in self.accs]
            # an algorithm gets the local sum (it exchanges parameters after the step)
            apply_fn(total if self.alg is not None else self.reduce(total, variables))
            for a in self.accs:
                if a is not None:
                    a.assign(tf.zeros_like(a))
            self.counter.assign(0)          # passes since the last exchange (Horovod's)
            return tf.constant(True)

        def skip():
            if iterations is not None:
                iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            flush() if int(count) >= self.passes else skip()
        else:
            tf.cond(count >= self.passes, flush, skip)


class _Distributed:
    """Marker base of every byteps-wrapped Keras optimizer."""
    _bps: _Settings

    def register_local_var(self, var) -> None:
        """Horovod's: ``var``'s gradient stays on this worker (divided by the number of
        workers unless ``scale_local_gradients=False``); every rank registers the same."""
        self._bps.local[id(var)] = var

    def compute_gradients(self, loss, var_list, tape=None):
        """Gradients of ``loss`` averaged across workers, as ``[(grad, var), ...]``."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's: ``loss`` (a tensor, or a callable run under ``tape``) differentiated
        and, with one backward pass per step, averaged across workers (the following
        ``apply_gradients`` of these gradients does not average them again; with
        ``backward_passes_per_step > 1`` ``apply_gradients`` aggregates, then averages)."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                if not callable(var_list):    # a Keras 3 variable's tf.Variable is .value
                    tape.watch([v if isinstance(v, tf.Variable) else getattr(v, "value", v)
                                for v in var_list])
                loss = loss()
        var_list = list(var_list() if callable(var_list) else var_list)
        grads = list(tape.gradient(loss, var_list, grad_loss))
        st = self._bps
        if st.passes == 1 and st.alg is None and not hasattr(self, "_bps_exchange"):
            grads = st.reduce(grads, var_list)
            st.reduced = grads
        return list(zip(grads, var_list))

    @property
    def _agg_helper(self) -> _Settings:
        """Horovod's name for the local gradient aggregation state: ``counter`` (a
        variable, created at the first step with ``backward_passes_per_step > 1``) holds
        the backward passes since the last exchange."""
        return self._bps

    def finish(self) -> None:
        """End of training: the algorithm's final exchange, so every rank ends with
        identical parameters (AsyncPS, ...; SyncPS after an uneven ``join()``: the model of
        the rank that joined last); every rank calls it (eagerly)."""
        if self._bps.alg is not None:
            self._bps.alg.finish()
        elif self._bps.variables:
            from byteps.core import algorithms as _algorithms
            arrs = {f"{self._bps.prefix}{i}": np.array(v.numpy(), order="C", copy=True)
                    for i, v in enumerate(self._bps.variables)}
            _algorithms.SyncPS(prefix=self._bps.prefix).finish(arrs)
            for v, a in zip(self._bps.variables, arrs.values()):
                v.assign(a)


class _Keras3(_Distributed):
    def build(self, variables):
        """Keras 3's build; inside a LossScaleOptimizer (``model.compile`` under
        ``mixed_float16``) it also makes the scaler's overflow check the job's
        (:mod:`byteps._keras.loss_scale`)."""
        super().build(variables)
        from byteps._keras.loss_scale import adopt
        adopt(self)

    def apply(self, grads, trainable_variables=None):
        """Average ``grads`` across workers, then apply them (Keras 3)."""
        if trainable_variables is None:
            if not self.built:
                raise ValueError("apply() without trainable_variables needs a built optimizer")
            trainable_variables = self._trainable_variables
        grads, variables = list(grads), list(trainable_variables)
        if not self.built:       # build outside any tf.cond below
            self.build(variables)
        st = self._bps
        if st.alg is not None:    # a core algorithm: local step, then parameters
            if st.passes == 1:
                return st.alg.apply(variables,
                                    lambda: super(_Keras3, self).apply(grads, variables))
            st.aggregate(grads, variables, lambda g: st.alg.apply(
                variables, lambda: super(_Keras3, self).apply(g, variables)))
            return None
        _report_lr(self, st)
        st.variables = variables
        if hasattr(self, "_bps_exchange"):     # QAdam: gradients, then compressed momenta
            return super().apply(_qadam_exchange(self, grads, variables, st), variables)
        if st.passes == 1:
            return super().apply(st.reduce(grads, variables), variables)
        st.aggregate(grads, variables, lambda g: super(_Keras3, self).apply(g, variables),
                     self.iterations)
        return None


class _Keras2(_Distributed):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Average the gradients across workers, then apply them (tf-keras 2)."""
        gv = list(grads_and_vars)
        grads, variables = [g for g, _ in gv], [v for _, v in gv]
        st = self._bps
        if st.alg is not None:    # a core algorithm: local step, then parameters
            if st.passes == 1:
                return st.alg.apply(variables, lambda: super(_Keras2, self).apply_gradients(
                    gv, *args, **kwargs))
            st.aggregate(grads, variables, lambda g: st.alg.apply(
                variables, lambda: super(_Keras2, self).apply_gradients(
                    list(zip(g, variables)), *args, **kwargs)))
            return self.iterations
        _report_lr(self, st)
        st.variables = variables
        if hasattr(self, "_bps_exchange"):     # QAdam: gradients, then compressed momenta
            return super().apply_gradients(
                list(zip(_qadam_exchange(self, grads, variables, st), variables)),
                *args, **kwargs)
        if st.passes == 1:
            return super().apply_gradients(list(zip(st.reduce(grads, variables), variables)),
                                           *args, **kwargs)
        st.aggregate(grads, variables, lambda g: super(_Keras2, self).apply_gradients(
            list(zip(g, variables)), *args, **kwargs), self.iterations)
        return self.iterations


def _scaled(grad, factor: float):
    """``grad * factor`` in its dtype (an IndexedSlices stays one)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype),
                                grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _report_lr(opt, st) -> None:
    """lr-aware error feedback: this step's learning rate to the core's compressors."""
    from byteps.tensorflow.compression import report_lr
    report_lr(opt, getattr(st.compression, "core_params", None),
              getattr(opt, "compression_params", None) if hasattr(opt, "_bps_exchange")
              else None)


def _qadam_exchange(opt, grads, variables, st):
    if st.passes != 1:
        raise ValueError("QAdamOptimizer does not support backward_passes_per_step > 1")
    return opt._bps_exchange(grads, variables, st)


def _is_built(opt) -> bool:
    if hasattr(opt, "stateless_apply"):          # Keras 3
        return bool(opt.built)
    return len(optimizer_variables(opt)) > 1     # more than `iterations`


def create_distributed_optimizer(keras, optimizer, name=None, device_dense="", device_sparse="",
                                 compression=Compression.none, sparse_as_dense=False,
                                 op=_ops.Average, backward_passes_per_step=1,
                                 average_aggregated_gradients=False, in_place=None,
                                 compression_params=None, algorithm=None,
                                 scale_local_gradients=True, process_set=None):
    """Wrap a Keras optimizer: same class name and config, gradients averaged across workers
    (among ``process_set``'s ranks only, with Horovod's ``process_set=``).

    An unbuilt optimizer is re-created from its config (the original stays
    untouched); a built one (it has state) is converted in place so that its
    slots survive.
    """
    _check_backend(keras)
    if isinstance(optimizer, _Distributed):
        raise TypeError(f"optimizer {type(optimizer).__name__} is already a byteps "
                        f"DistributedOptimizer; wrap the plain optimizer once")
    if not hasattr(optimizer, "apply_gradients"):
        raise TypeError(f"DistributedOptimizer needs a Keras optimizer or a "
                        f"tf.compat.v1.train.Optimizer, got {type(optimizer).__name__}")
    if hasattr(getattr(optimizer, "inner_optimizer", None), "_bps_exchange"):
        from byteps.core import compat
        compat.refuse("qadam-loss-scale", f"DistributedOptimizer({type(optimizer).__name__}("
                                          f"{type(optimizer.inner_optimizer).__name__}))")
    from byteps.tensorflow.compression import with_params
    compression = with_params(compression, _momentum_params(optimizer, compression_params))
    base = type(optimizer)
    mixin = _Keras3 if hasattr(optimizer, "stateless_apply") else _Keras2
    cls = type(base.__name__, (mixin, base), {"__module__": base.__module__,
                                              "__doc__": base.__doc__})
    if in_place is None:
        in_place = _is_built(optimizer)
    moved = compression_params and compression_params.get("momentum")
    if in_place:
        opt = optimizer
        opt.__class__ = cls
        if moved:
            opt.momentum = 0.0
    else:
        config = optimizer.get_config()
        if moved:
            config["momentum"] = 0.0     # the compressor does the momentum now
        opt = cls.from_config(config)
    prefix = (name or "Distributed" + base.__name__) + ".Push_Pull."
    settings = _Settings(prefix, compression, sparse_as_dense, _ops.resolve_op(op, None),
                         device_dense, device_sparse, backward_passes_per_step,
                         average_aggregated_gradients)
    settings.scale_local = bool(scale_local_gradients)
    settings.process_set = _ops.gradient_process_set(process_set)
    from byteps._keras.algorithm import resolve
    settings.alg = resolve(algorithm, settings, op)   # Adasum, BYTEPS_ENABLE_ASYNC=1: AsyncPS
    if settings.alg is not None and settings.process_set is not None:
        from byteps.core import compat
        compat.refuse("process-set-algorithm", f"DistributedOptimizer(process_set="
                                               f"{settings.process_set!r}, algorithm="
                                               f"{settings.alg.algorithm.describe()})")
    if settings.alg is not None and hasattr(opt, "_bps_exchange"):
        from byteps.core import compat
        compat.refuse("qadam-algorithm", f"{type(opt).__name__} with "
                                         f"{settings.alg.algorithm.describe()}")
    object.__setattr__(opt, "_bps", settings)   # bypass Keras attribute tracking
    return opt


def _momentum_params(optimizer, params):
    """Compressor momentum takes ``mu`` from the optimizer's ``momentum`` (unless given)."""
    if not params or not params.get("momentum") or "mu" in params:
        return params
    mu = getattr(optimizer, "momentum", None)
    if not isinstance(mu, (int, float)) or not 0 < mu < 1:
        raise ValueError(f"compression_params['momentum']={params['momentum']!r} takes mu from "
                         f"the optimizer's momentum, but {type(optimizer).__name__} has "
                         f"momentum={mu!r}; use e.g. SGD(momentum=0.9) or give "
                         f"compression_params['mu']")
    return dict(params, mu=float(mu))


# ------------------------------------------------------------------ module-level helpers
def all_model_variables(keras) -> list:
    """Variables of every Keras model alive in this process and of their optimizers.

    TensorFlow 2 keeps no global variable collection, so the models are found
    by scanning live objects once; they are sorted by name so that every rank
    lists them in the same order.
    """
    seen, out = set(), []
    models = [o for o in gc.get_objects() if isinstance(o, keras.Model)]
    for m in models:
        for v in list(m.variables) + optimizer_variables(getattr(m, "optimizer", None)):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return sorted(out, key=lambda v: _ops.var_name(v, 0))


def broadcast_global_variables(keras, root_rank):
    """Broadcast every Keras model's (and optimizer's) variables from ``root_rank``.

    In a TF1 graph this runs the broadcast of ``tf.compat.v1.global_variables()``.
    """
    import byteps.tensorflow as bps
    if not tf.executing_eagerly():
        sess = tf.compat.v1.get_default_session() or tf.compat.v1.keras.backend.get_session()
        return sess.run(bps.broadcast_global_variables(root_rank))
    variables = all_model_variables(keras)
    if not variables:
        warnings.warn("broadcast_global_variables: no built Keras model found; build the model "
                      "first or use BroadcastGlobalVariablesCallback", stacklevel=3)
    return bps.broadcast_variables(variables, root_rank, scope="BroadcastGlobalVariables")


def load_model(keras, filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """``keras.models.load_model`` whose optimizer comes back as a DistributedOptimizer."""
    objs = {c.__name__: c for c in (custom_optimizers or [])}
    objs.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objs)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not isinstance(opt, _Distributed):
        create_distributed_optimizer(keras_of(opt), opt, compression=compression, in_place=True)
    return model

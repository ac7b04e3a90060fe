"""Callback implementations shared by ``byteps.keras`` and ``byteps.tensorflow.keras``.

Each ``*Impl`` is mixed with the front end's ``keras.callbacks.Callback``
(Keras 3 or tf-keras), Horovod style.
"""
from __future__ import annotations

import numbers
import warnings
import zlib

import numpy as np
import tensorflow as tf

from byteps._keras import _is_built, optimizer_variables
from byteps.core import api as core
from byteps.tensorflow import _ops


def _value(x) -> float:
    return float(np.asarray(x.numpy() if hasattr(x, "numpy") else x))


class BroadcastGlobalVariablesCallbackImpl:
    """Make every rank start from rank ``root_rank``'s model and optimizer state.

    What exists when training begins is broadcast then, so that even the first
    gradients come from identical weights.  A model built lazily (a ``Sequential``
    without an input shape) and the optimizer's slots only get their variables in
    the first step: like Horovod, everything is broadcast again right after that
    step, before the second update.  That is done by wrapping ``model.train_function``
    for one call rather than by a batch hook, so Keras 3 keeps its asynchronous
    callback dispatch.
    """

    def __init__(self, backend, root_rank: int, device: str = "", *args, local_variables=None):
        super().__init__(*args)
        self.backend, self.root_rank, self.device = backend, root_rank, device
        # Horovod's local_variables: each rank keeps its own values of these
        self.local_ids = {id(v) for v in (local_variables or [])}
        self.broadcast_done = False
        self._train = None          # the model's own train_function while ours wraps it

    def _model_variables(self) -> list:
        try:
            return list(self.model.variables)
        except ValueError:          # tf-keras: "Weights for model ... not yet created"
            return []

    def _complete(self) -> bool:
        """Whether every variable the first step would create exists already."""
        model, opt = self.model, getattr(self.model, "optimizer", None)
        return (bool(getattr(model, "built", True)) and bool(self._model_variables())
                and (opt is None or _is_built(opt)))

    def _broadcast(self) -> None:
        opt = getattr(self.model, "optimizer", None)
        seen, variables = set(self.local_ids), []
        for v in self._model_variables() + optimizer_variables(opt):
            if id(v) not in seen:
                seen.add(id(v))
                variables.append(v)
        with tf.device(self.device):
            _ops_broadcast(variables, self.root_rank)

    def _broadcast_after_first_step(self) -> None:
        model = self.model
        train = getattr(model, "train_function", None)
        if train is None:       # not a Keras fit loop we know: the batch-end hook, if any
            return
        self._train = train

        def first_step(*args, **kwargs):
            self._restore()
            logs = train(*args, **kwargs)
            self._broadcast()
            self.broadcast_done = True
            return logs
        model.train_function = first_step

    def _restore(self) -> None:
        if self._train is not None:
            self.model.train_function, self._train = self._train, None

    def on_train_begin(self, logs=None):
        if core.size() == 1 or self.broadcast_done:
            self.broadcast_done = True
            return
        self._broadcast()
        if self._complete():
            self.broadcast_done = True
        else:
            self._broadcast_after_first_step()

    def on_train_end(self, logs=None):
        self._restore()                      # fit() ended before its first step


class BroadcastAfterFirstBatchMixin:
    """tf-keras: a batch-end fallback for fit loops without a ``train_function`` to wrap.

    Keras 3 has none: a batch-end hook there would turn off its asynchronous
    callback dispatch.
    """

    def on_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()
            self.broadcast_done = True


def _ops_broadcast(variables, root_rank):
    import byteps.tensorflow as bps
    bps.broadcast_variables(variables, root_rank, scope="BroadcastGlobalVariablesCallback")


class MetricAverageCallbackImpl:
    """Average the epoch's logged metrics over all ranks (put it before other callbacks)."""

    def __init__(self, backend, device: str = "", *args):
        super().__init__(*args)
        self.backend, self.device = backend, device

    def _average_metrics_in_place(self, logs):
        if not logs or core.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, numbers.Number)
                      or (hasattr(v, "shape") and np.size(v) == 1))
        _ops.check_same("logged metric names", keys)
        if not keys:
            return
        vals = np.array([_value(logs[k]) for k in keys], np.float64)
        tag = zlib.crc32(",".join(keys).encode())
        avg = core.push_pull(vals, f"MetricAverageCallback.{tag}", average=True)
        for k, v in zip(keys, avg):
            logs[k] = float(v)

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def get_lr(opt) -> float:
    return _value(opt.learning_rate)


def set_lr(opt, value: float) -> None:
    opt.learning_rate = value


class LearningRateScheduleCallbackImpl:
    """lr = ``initial_lr * multiplier(epoch)`` between ``start_epoch`` and ``end_epoch``.

    ``multiplier`` is a constant or a function of the (fractional, when not
    ``staircase``) epoch.  ``initial_lr=None`` reads the optimizer's rate at
    the start of training.  Momentum correction (scaling momentum by
    new_lr/old_lr for the step after a change) needs the momentum to be a
    variable, as in tf-keras legacy optimizers; Keras 3 compiles momentum as a
    constant, so it is skipped there.
    """

    def __init__(self, backend, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None, *args):
        super().__init__(*args)
        self.backend = backend
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.restore_momentum = None
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.staircase = True
            self.multiplier = lambda epoch: multiplier

    def _autodetect_steps_per_epoch(self) -> int:
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            return params["steps"]
        if params.get("samples") and params.get("batch_size"):
            return params["samples"] // params["batch_size"]
        raise ValueError(f"{type(self).__name__}: could not detect the number of steps per "
                         f"epoch; pass steps_per_epoch=")

    def _adjust_learning_rate(self, epoch) -> None:
        opt = self.model.optimizer
        old_lr = get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        set_lr(opt, new_lr)
        mom = getattr(opt, "momentum", None)
        if self.momentum_correction and hasattr(mom, "assign") and old_lr:
            self.restore_momentum = _value(mom)
            mom.assign(self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            self.model.optimizer.momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()
        mom = getattr(self.model.optimizer, "momentum", None)
        if self.momentum_correction and isinstance(mom, numbers.Number) and mom:
            warnings.warn(f"{type(self).__name__}: momentum correction is skipped because the "
                          f"optimizer's momentum is a constant ({mom}), not a variable",
                          stacklevel=2)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch
                or (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = get_lr(self.model.optimizer)


class MomentumRestoreMixin:
    """Undo momentum correction after the step (tf-keras only: Keras 3 momentum is a constant,
    and a batch-end hook would turn off Keras 3's asynchronous callback dispatch)."""

    def on_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()


def batch_end_mixins(keras, mixin) -> tuple:
    """``(mixin,)`` for tf-keras, ``()`` for Keras 3."""
    return () if hasattr(keras.optimizers.Optimizer, "stateless_apply") else (mixin,)


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    """Ramp lr from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``.

    As in Goyal et al., "Accurate, Large Minibatch SGD"."""

    def __init__(self, backend, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Round numbers at the end of each epoch (nicer learning-rate plots).
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / core.size() * (epoch * (core.size() - 1) / warmup_epochs + 1)
        super().__init__(backend, initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{get_lr(self.model.optimizer):g}.")


def populate(ns: dict, keras) -> None:
    """Define the callbacks of a front end bound to ``keras`` in the module namespace
    ``ns`` (``bps.callbacks.X``), with ``__all__``."""
    base = keras.callbacks.Callback

    class BroadcastGlobalVariablesCallback(BroadcastGlobalVariablesCallbackImpl,
                                           *batch_end_mixins(keras,
                                                             BroadcastAfterFirstBatchMixin),
                                           base):
        """Broadcast rank ``root_rank``'s model and optimizer variables when training
        starts, except ``local_variables`` (Horovod's: each rank keeps its own)."""

        def __init__(self, root_rank, device="", local_variables=None):
            super().__init__(keras.backend, root_rank, device, local_variables=local_variables)

    class MetricAverageCallback(MetricAverageCallbackImpl, base):
        """Average the metrics logged at the end of each epoch over all workers."""

        def __init__(self, device=""):
            super().__init__(keras.backend, device)

    class LearningRateScheduleCallback(LearningRateScheduleCallbackImpl,
                                       *batch_end_mixins(keras, MomentumRestoreMixin), base):
        """Set lr to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
        ``end_epoch``."""

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                     staircase=True, momentum_correction=True, steps_per_epoch=None):
            super().__init__(keras.backend, initial_lr, multiplier, start_epoch, end_epoch,
                             staircase, momentum_correction, steps_per_epoch)

    class LearningRateWarmupCallback(LearningRateWarmupCallbackImpl,
                                     *batch_end_mixins(keras, MomentumRestoreMixin), base):
        """Warm lr up from ``initial_lr / size()`` to ``initial_lr`` over
        ``warmup_epochs``."""

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                     steps_per_epoch=None, verbose=0):
            super().__init__(keras.backend, initial_lr, warmup_epochs, momentum_correction,
                             steps_per_epoch, verbose)

    made = [BroadcastGlobalVariablesCallback, MetricAverageCallback,
            LearningRateScheduleCallback, LearningRateWarmupCallback]
    for cls in made:
        cls.__module__, cls.__qualname__ = ns["__name__"], cls.__name__
        ns[cls.__name__] = cls
    ns["__all__"] = [cls.__name__ for cls in made]

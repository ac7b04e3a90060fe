"""Keras callbacks for BytePS (``bps.callbacks.X``)."""
from __future__ import annotations

from byteps._keras import callbacks as _impl
from byteps.tensorflow.keras import keras


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl,
                                       *_impl.batch_end_mixins(
                                           keras, _impl.BroadcastAfterFirstBatchMixin),
                                       keras.callbacks.Callback):
    """Broadcast rank ``root_rank``'s model and optimizer variables when training starts."""

    def __init__(self, root_rank, device=""):
        super().__init__(keras.backend, root_rank, device)


class MetricAverageCallback(_impl.MetricAverageCallbackImpl, keras.callbacks.Callback):
    """Average the metrics logged at the end of each epoch over all workers."""

    def __init__(self, device=""):
        super().__init__(keras.backend, device)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl,
                                   *_impl.batch_end_mixins(keras, _impl.MomentumRestoreMixin),
                                   keras.callbacks.Callback):
    """Set lr to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to ``end_epoch``."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__(keras.backend, initial_lr, multiplier, start_epoch, end_epoch,
                         staircase, momentum_correction, steps_per_epoch)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl,
                                 *_impl.batch_end_mixins(keras, _impl.MomentumRestoreMixin),
                                 keras.callbacks.Callback):
    """Warm lr up from ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs``."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        super().__init__(keras.backend, initial_lr, warmup_epochs, momentum_correction,
                         steps_per_epoch, verbose)

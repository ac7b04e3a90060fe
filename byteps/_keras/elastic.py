"""Elastic state of a Keras model (``bps.elastic.KerasState`` = ``TensorFlowKerasState`` in
``byteps.keras``, ``byteps.tensorflow.keras`` and ``byteps.tensorflow``; see
docs/fault_tolerance.md).

It keeps a Keras model's weights and its optimizer's variables through their numpy
interface (``get_weights``/``set_weights``, ``variables``, ``numpy()``/``assign()``), on
top of the framework-free :class:`byteps.core.elastic.state.ObjectState`.
"""
from __future__ import annotations

import numpy as np

from byteps.common.errors import BytePSError
from byteps.core import api
from byteps.core.elastic.state import ObjectState, broadcast_value

__all__ = ["TensorFlowKerasState", "KerasState"]


class TensorFlowKerasState(ObjectState):
    """``model`` (a Keras model), its ``optimizer`` (default ``model.optimizer``; may be
    None) and keyword attributes (``epoch``, ``batch``, ...)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        self._saved_model = [np.array(w, copy=True) for w in model.get_weights()]
        self._saved_optimizer = self._optimizer_values()
        super().__init__(**kwargs)

    def _optimizer_vars(self) -> list:
        if self.optimizer is None:
            return []
        v = getattr(self.optimizer, "variables", [])
        return list(v() if callable(v) else v)

    def _optimizer_values(self) -> list:
        return [np.array(v.numpy(), copy=True) for v in self._optimizer_vars()]

    def save(self) -> None:
        self._saved_model = [np.array(w, copy=True) for w in self.model.get_weights()]
        self._saved_optimizer = self._optimizer_values()
        super().save()

    def restore(self) -> None:
        self.model.set_weights(self._saved_model)
        now = self._optimizer_vars()
        if len(now) == len(self._saved_optimizer):
            for v, value in zip(now, self._saved_optimizer):
                v.assign(value)
        super().restore()

    def sync(self) -> None:
        weights = self.model.get_weights()
        self.model.set_weights([api.broadcast(np.array(w, copy=True), 0,
                                              name=f"elastic.keras.model.{i}").reshape(w.shape)
                                for i, w in enumerate(weights)])
        opt_vars = self._optimizer_vars()
        n = broadcast_value(len(opt_vars), "elastic.keras.optimizer.count")
        if len(opt_vars) != n and n and not opt_vars and hasattr(self.optimizer, "build"):
            self.optimizer.build(self.model.trainable_variables)   # joined before a step
            opt_vars = self._optimizer_vars()
        if len(opt_vars) != n:
            raise BytePSError(f"elastic sync on rank {api.rank()}: the optimizer has "
                              f"{len(opt_vars)} variable(s), rank 0's has {n}; build the same "
                              f"model and optimizer on every rank")
        for i, v in enumerate(opt_vars):
            value = np.array(v.numpy(), copy=True)     # (ascontiguousarray makes 0-d 1-d)
            v.assign(api.broadcast(value, 0, name=f"elastic.keras.optimizer.{i}."
                                                   f"{value.dtype}.{value.shape}")
                     .reshape(value.shape))
        super().sync()
        self.save()


KerasState = TensorFlowKerasState     # Horovod's name in horovod.keras


# ---------------------------------------------------------------- Horovod's elastic callbacks
class CommitStateCallbackImpl:
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch's end."""

    def __init__(self, backend, state, batches_per_commit: int = 1, *args):
        super().__init__(*args)
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int) \
                or batches_per_commit < 1:
            raise ValueError(f"CommitStateCallback(batches_per_commit={batches_per_commit!r}):"
                             f" must be an integer >= 1")
        self.backend, self.state = backend, state
        self.batches_per_commit = self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit    # the same on every rank

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    """Keep ``state.batch`` (the batch reached in this epoch), and after a reset start the
    epoch's remaining steps only."""

    def __init__(self, backend, state, *args):
        super().__init__(*args)
        self.backend, self.state, self.steps_per_epoch = backend, state, None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallbackImpl:
    """Keep ``state.epoch``: the epochs done across resets (Keras counts from 0 in each
    ``fit``), so a reset resumes at the next epoch."""

    def __init__(self, backend, state, *args):
        super().__init__(*args)
        self.backend, self.state = backend, state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


def populate_callbacks(ns: dict, keras) -> None:
    """Horovod's ``CommitStateCallback``, ``UpdateBatchStateCallback`` and
    ``UpdateEpochStateCallback`` bound to ``keras``, defined in the namespace ``ns``."""
    base = keras.callbacks.Callback

    class CommitStateCallback(CommitStateCallbackImpl, base):
        """Commit the elastic state every ``batches_per_commit`` batches and at each
        epoch's end (a reset then loses at most that many batches)."""

        def __init__(self, state, batches_per_commit=1):
            super().__init__(keras.backend, state, batches_per_commit)

    class UpdateBatchStateCallback(UpdateBatchStateCallbackImpl, base):
        """Track ``state.batch``; a reset resumes the epoch where it was."""

        def __init__(self, state):
            super().__init__(keras.backend, state)

    class UpdateEpochStateCallback(UpdateEpochStateCallbackImpl, base):
        """Track ``state.epoch`` across resets."""

        def __init__(self, state):
            super().__init__(keras.backend, state)

    for cls in (CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback):
        cls.__module__ = ns.get("__name__", cls.__module__)
        ns[cls.__name__] = cls

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

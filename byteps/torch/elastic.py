"""Elastic training with PyTorch: ``bps.elastic.run`` and ``bps.elastic.TorchState``.

    state = bps.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @bps.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, steps_per_epoch):
                ...forward, backward, optimizer.step()...
                if state.batch % 5 == 0:
                    state.commit()
            state.batch = 0

    train(state)

Horovod's user model (docs/fault_tolerance.md); the logic lives in byteps.core.elastic,
this module only copies and broadcasts the model's and the optimizer's state.
"""
from __future__ import annotations

import copy

from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps.core.elastic.state import ObjectState, State

__all__ = ["run", "reset", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt",
           "WorkersChanged", "check_host_updates", "membership_changed"]


def _bcast_object(obj, name):
    from byteps.torch.functions import broadcast_object
    return broadcast_object(obj, root_rank=0, name=name)


class TorchState(ObjectState):
    """A model and an optimizer (either may be None) plus keyword attributes (``epoch``,
    ``batch``, ...): committed as copies of their ``state_dict()``, restored with
    ``load_state_dict``, synced with ``broadcast_parameters`` / ``broadcast_optimizer_state``
    from rank 0."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self._saved_model = self._copy(model)
        self._saved_optimizer = self._copy(optimizer)
        super().__init__(bcast_object=_bcast_object, **kwargs)

    @staticmethod
    def _copy(obj):
        return None if obj is None else copy.deepcopy(obj.state_dict())

    def save(self) -> None:
        self._saved_model = self._copy(self.model)
        self._saved_optimizer = self._copy(self.optimizer)
        super().save()

    def restore(self) -> None:
        # a CrossBarrier's updates of the interrupted step may still be in flight: they end
        # (failed, the epoch is over) before the commit replaces what they did
        getattr(self.optimizer, "_bps_quiesce", lambda: None)()
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        self.reset()
        super().restore()

    def sync(self) -> None:
        from byteps.torch.functions import broadcast_optimizer_state, broadcast_parameters
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0, prefix="elastic.model.")
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0, prefix="elastic.optimizer.")
        super().sync()
        self.save()

    def reset(self) -> None:
        """Forget the gradients' push_pulls of the old epoch (a DistributedOptimizer's
        handles) so that the next backward pass starts clean."""
        opt = self.optimizer
        if opt is not None and hasattr(opt, "_bps_handles"):
            opt._bps_handles.clear()
            opt._bps_delay = {p: opt._bps_bpps for p in opt._bps_delay}
            opt._bps_synchronized = False

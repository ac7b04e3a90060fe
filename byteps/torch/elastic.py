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
import random

import torch.utils.data

from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps.core.elastic.state import ObjectState, State

__all__ = ["run", "reset", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "WorkersChanged", "check_host_updates", "membership_changed"]


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
        # ElasticSampler attributes (Horovod's train_sampler=...): kept by their state_dict
        self._samplers = {k: kwargs.pop(k) for k in [k for k, v in kwargs.items()
                                                      if isinstance(v, ElasticSampler)]}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        self._saved_samplers = {k: v.state_dict() for k, v in self._samplers.items()}
        super().__init__(bcast_object=_bcast_object, **kwargs)

    @staticmethod
    def _copy(obj):
        return None if obj is None else copy.deepcopy(obj.state_dict())

    def save(self) -> None:
        self._saved_model = self._copy(self.model)
        self._saved_optimizer = self._copy(self.optimizer)
        self._saved_samplers = {k: v.state_dict() for k, v in self._samplers.items()}
        super().save()

    def restore(self) -> None:
        # a CrossBarrier's updates of the interrupted step may still be in flight: they end
        # (failed, the epoch is over) before the commit replaces what they did
        getattr(self.optimizer, "_bps_quiesce", lambda: None)()
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for k, v in self._samplers.items():
            v.load_state_dict(self._saved_samplers[k])
        self.reset()
        super().restore()

    def sync(self) -> None:
        from byteps.torch.functions import broadcast_optimizer_state, broadcast_parameters
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0, prefix="elastic.model.")
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0, prefix="elastic.optimizer.")
        for k in sorted(self._samplers):     # rank 0's progress, split over today's ranks
            self._samplers[k].load_state_dict(
                _bcast_object(self._samplers[k].state_dict(), f"elastic.sampler.{k}"))
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


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)``: like
    ``DistributedSampler``, and after a reset the indices not yet processed this epoch are
    split over the ranks there are then.  Put it in the ``TorchState``
    (``TorchState(model, optimizer, train_sampler=sampler)``), call
    ``record_batch(batch_idx, batch_size)`` after each batch and ``set_epoch(epoch)`` at the
    end of each epoch (not the start: a partial epoch would be processed again)."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch, self.processed_num = 0, 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """``batch_size`` samples processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch, self.processed_num = state_dict["epoch"], state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Split what is left of this epoch over the ranks there are now."""
        from byteps.core import api
        self.num_replicas, self.rank = api.size(), api.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:                      # the same order on every rank
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = self.remaining_indices[:]
        idx += idx[:self.total_size - len(idx)]          # padded to divide evenly
        return iter(idx[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

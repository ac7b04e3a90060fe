"""Elastic training with Keras: ``bps.elastic.run``, ``bps.elastic.KerasState``
(= ``TensorFlowKerasState``) and Horovod's ``CommitStateCallback``,
``UpdateBatchStateCallback`` and ``UpdateEpochStateCallback``; see
docs/fault_tolerance.md."""
from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps._keras import default_keras as _default_keras
from byteps._keras.elastic import KerasState, TensorFlowKerasState
from byteps._keras.elastic import populate_callbacks as _populate_callbacks
from byteps.core.elastic.state import ObjectState, State

__all__ = ["run", "reset", "State", "ObjectState", "KerasState", "TensorFlowKerasState",
           "HostsUpdatedInterrupt", "WorkersChanged", "check_host_updates", "membership_changed",
           "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]

_populate_callbacks(globals(), _default_keras())

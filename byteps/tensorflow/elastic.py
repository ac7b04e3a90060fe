"""Elastic training with TensorFlow/Keras: ``bps.elastic.run`` and
``bps.elastic.TensorFlowKerasState``; see docs/fault_tolerance.md."""
from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps._keras.elastic import KerasState, TensorFlowKerasState
from byteps.core.elastic.state import ObjectState, State

__all__ = ["run", "reset", "State", "ObjectState", "KerasState", "TensorFlowKerasState",
           "HostsUpdatedInterrupt", "WorkersChanged", "check_host_updates", "membership_changed"]

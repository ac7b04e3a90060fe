"""Elastic training for numpy (and JAX) users: ``bps.elastic.run`` and the states.

    import byteps.numpy as bps
    state = bps.elastic.NumpyState({"w": w, "b": b}, step=0)

    @bps.elastic.run
    def train(state):
        while state.step < steps:
            ...
            state.step += 1
            if state.step % 5 == 0:
                state.commit()

See docs/fault_tolerance.md; the logic lives in byteps.core.elastic.
"""
from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps.core.elastic.state import NumpyState, ObjectState, State, broadcast_value

__all__ = ["run", "reset", "State", "ObjectState", "NumpyState", "HostsUpdatedInterrupt",
           "WorkersChanged", "check_host_updates", "membership_changed", "broadcast_value"]

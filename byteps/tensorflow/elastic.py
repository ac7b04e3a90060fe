"""Elastic training with TensorFlow/Keras: ``bps.elastic.run``,
``bps.elastic.TensorFlowKerasState`` and ``bps.elastic.TensorFlowState`` (Horovod's state of
a list of ``tf.Variable``); see docs/fault_tolerance.md."""
from byteps.core.elastic import (HostsUpdatedInterrupt, WorkersChanged, check_host_updates,
                                 membership_changed, reset, run)
from byteps._keras.elastic import KerasState, TensorFlowKerasState
from byteps.core.elastic.state import ObjectState, State

__all__ = ["run", "reset", "State", "ObjectState", "KerasState", "TensorFlowKerasState",
           "TensorFlowState", "HostsUpdatedInterrupt", "WorkersChanged", "check_host_updates",
           "membership_changed"]


class TensorFlowState(ObjectState):
    """Horovod's state of TensorFlow variables: ``variables`` (default: the TF1 global
    variables) and keyword attributes (``epoch``, ``batch``, ...), committed, restored and
    synced from rank 0.  Eager, or in a TF1 graph with ``session`` (default: the default
    session) materializing the values."""

    def __init__(self, variables=None, session=None, **kwargs):
        import tensorflow as tf
        self._tf = tf
        self.variables = list(variables) if variables is not None \
            else tf.compat.v1.global_variables()
        self.session = session or tf.compat.v1.get_default_session()
        self._eager = tf.executing_eagerly()
        if not self._eager:
            from byteps.tensorflow import broadcast_variables
            self._bcast_op = broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().__init__(**kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables, self._values):
            if self._eager:
                var.assign(value)
            else:
                var.load(value, self.session)
        super().restore()

    def sync(self) -> None:
        if self._eager:
            from byteps.tensorflow import broadcast_variables
            broadcast_variables(self.variables, root_rank=0)
        elif self.session is not None:
            self.session.run(self._bcast_op)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._values = [v.numpy() if self._eager else v.eval(self.session)
                        for v in self.variables]

"""``byteps.tensorflow.distribute.MirroredStrategy``: the original BytePS's
``tf.distribute`` strategy (its ``docs/MirroredStrategy.md``)::

    import byteps.tensorflow as bps
    from byteps.tensorflow.distribute import MirroredStrategy
    bps.init()
    strategy = MirroredStrategy(devices=["/gpu:0"])
    with strategy.scope():
        model = build_and_compile_model()
    model.fit(dataset, ...)

``tf.distribute.MirroredStrategy`` over this process's devices, whose cross-device
reductions go on through byteps: the replicas' values are reduced on this process's
first device (``reduce_op`` SUM or MEAN, as TensorFlow does), then **averaged over the
workers** with one push_pull per value.  Each worker is one data-parallel copy of the
local strategy, as under ``DistributedOptimizer``: ``num_replicas_in_sync`` counts this
process's devices (Keras scales the loss by it), every worker reads its own dataset, and
the averaged gradient is the mean over every worker's batch.  New variables take rank
0's initial value (the original left each worker's own, so the models never agreed).

Devices named ``/gpu:N`` run on this process's CPU when it sees no GPU (a log line says
so), so the original's example runs on a CPU host unchanged.  TensorFlow's one-replica
shortcut, which would skip the reduction, is off while the job has several workers.
"""
from __future__ import annotations

import itertools
import logging
import types

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cdo
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import mirrored_strategy as _ms

from byteps.core import api as core
from byteps.tensorflow import _ops
from byteps.tensorflow.compression import NoneCompressor

__all__ = ["BytePSCrossDeviceOps", "MirroredStrategy"]

log = logging.getLogger("byteps")
PREFIX = "MirroredStrategy."


class BytePSCrossDeviceOps(_cdo.ReductionToOneDevice):
    """Reduce the local replicas' values on one device, then average them over the
    workers with push_pull (``tf.distribute.ReductionToOneDevice`` plus byteps)."""

    @property
    def _num_between_graph_workers(self):
        return core.size()          # > 1: TensorFlow's one-replica shortcut is off

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self.batch_reduce_implementation(
            reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        del options
        local, devices = [], []
        for value, dest in value_destination_pairs:
            found = _cdo.get_devices_from(dest if _cdo.check_destinations(dest) else value,
                                          self._canonicalize_devices)
            devices.append(found[0])
            local.append(_cdo._simple_reduce(value, found[0], self.accumulation_fn,
                                             reduce_op))
        # the same names on every rank and in every step: the position and the shape
        names = [types.SimpleNamespace(path=f"{i}.{t.dtype.name}{list(t.shape)}")
                 for i, t in enumerate(local)]
        reduced = local
        if core.size() > 1:
            with tf.device(devices[0]):
                reduced = _ops.push_pull_grads(local, names, PREFIX, NoneCompressor,
                                               False, _ops.Average, step=False)
        return [self.broadcast(r, dest) for r, (_, dest) in zip(reduced, value_destination_pairs)]


class _Extended(_ms.MirroredExtended):
    """MirroredExtended whose new variables start from rank 0's value."""

    _made = itertools.count()

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        init = super()._get_variable_creator_initial_value(replica_id, device, primary_var,
                                                           **kwargs)
        if replica_id != 0 or core.size() == 1:
            return init       # the other local replicas copy replica 0's (TensorFlow's)
        name = f"{PREFIX}init.{next(self._made)}.{kwargs.get('name') or 'variable'}"
        dtype = kwargs.get("dtype")

        def rank0_value():
            value = init() if callable(init) else init
            value = tf.convert_to_tensor(value, dtype=dtype)
            return _ops.broadcast_tensors([value], [name], 0)[0]
        return rank0_value


class MirroredStrategy(_ms.MirroredStrategy):
    """The original BytePS's ``MirroredStrategy(devices=None, cross_device_ops=None)``:
    this process's ``devices`` (None: its GPUs, else its CPU), reductions averaged over
    the workers by byteps (:class:`BytePSCrossDeviceOps`, the default
    ``cross_device_ops``)."""

    def __init__(self, devices=None, cross_device_ops=None):
        from byteps.core.api import basics
        if not core.is_initialized():
            basics.init()
        basics.refuse_async_wrapper("MirroredStrategy")
        extended = _Extended(self, devices=_local_devices(devices),
                             cross_device_ops=cross_device_ops or BytePSCrossDeviceOps())
        distribute_lib.Strategy.__init__(self, extended)   # tf's own makes its extended


def _local_devices(devices):
    """``devices`` as given, GPUs mapped to this process's CPU when it has no GPU."""
    if devices is None:
        return None
    devices = list(devices)
    if any("gpu" in d.lower() for d in devices) and not tf.config.list_logical_devices("GPU"):
        log.info("MirroredStrategy(devices=%r): this process sees no GPU; its replica runs "
                 "on /cpu:0", devices)
        return ["/cpu:0"]
    return devices

"""TensorFlow <-> numpy plumbing for the collectives of byteps.tensorflow.

An operation is a function of numpy arrays (calling :mod:`byteps.core.collective.ops`) that
:func:`run` calls at once when eager, or wraps in one ``tf.numpy_function`` op inside
``tf.function`` and TF1 graphs.  Everything else here is conversion:

* dtypes: the core's collectives take every dtype of :mod:`byteps.core.collective.carry`'s table as
  numpy arrays and give results back in that dtype; :func:`to_wire` only casts the small
  floats (bfloat16, float8) as the table says, for exchanges that take wire dtypes;
* errors: when eager, a disagreement between ranks (the core's BytePSError) is raised as
  :class:`CollectiveError`, a ``tf.errors.FailedPreconditionError`` that is also a
  BytePSError, and an invalid argument found during the exchange (e.g. alltoall splits
  that do not fit, reported by the core on every rank) as :class:`InvalidArgument`, a
  ``tf.errors.InvalidArgumentError`` that is also a ValueError (Horovod's classes).
  Inside a graph TensorFlow turns a ValueError into InvalidArgumentError and anything
  else into UnknownError, keeping the message;
* order: in a TF1 graph every byteps op gets a control dependency on the previous one,
  so that every rank runs them in creation order (``tf.function`` already runs stateful
  ops in program order); ops that wait for other ranks could otherwise deadlock when two
  ranks pick different orders.
"""
from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from byteps.core.api import BytePSError
from byteps.core.collective.carry import wire_dtype

_last_op: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class CollectiveError(tf.errors.FailedPreconditionError, BytePSError):
    """The ranks disagree (shapes, dtypes, root ranks, ...) or the job failed; the message
    names the tensor and the ranks."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class InvalidArgument(tf.errors.InvalidArgumentError, ValueError):
    """An argument is invalid for this operation (e.g. splits that do not add up)."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def as_tf_error(exc: BaseException) -> BaseException:
    """The core's ValueErrors (also its BadArgumentError: splits no rank can use, reported
    on every rank) as InvalidArgumentError, other BytePSErrors as FailedPreconditionError,
    as Horovod."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, ValueError):
        return InvalidArgument(str(exc))
    if isinstance(exc, BytePSError):
        return CollectiveError(str(exc))
    return exc


def to_wire(t: tf.Tensor, copy: bool = True):
    """``(t, None)``, or for a small float (bfloat16, float8) ``(t as the dtype
    :func:`byteps.core.collective.carry.wire_dtype` names, t's dtype)``; every other dtype goes to
    the core as it is (the core carries it by the same table, or refuses it by name)."""
    d = t.dtype
    to = wire_dtype(d.name, copy)
    if d.is_floating and to is not None and to != d.name:
        return tf.cast(t, to), d
    return t, None


def from_wire(t: tf.Tensor, dtype):
    return t if dtype is None else tf.cast(t, dtype)


def eager() -> bool:
    return tf.executing_eagerly()


def _in_v1_graph() -> bool:
    from tensorflow.python.framework import func_graph
    return not isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph)


def run(fn, inputs: list, specs: list, kind: str) -> list:
    """``fn(*numpy arrays) -> list of numpy arrays`` on ``inputs``; ``specs`` holds one
    ``(dtype, shape)`` per result.  Eager: called now; else one ``tf.numpy_function`` op."""
    if eager():
        try:
            outs = fn(*[np.asarray(t.numpy()) for t in inputs])
        except (BytePSError, ValueError) as exc:
            raise as_tf_error(exc) from None
        return [tf.convert_to_tensor(np.asarray(o, d.as_numpy_dtype))
                for o, (d, _) in zip(outs, specs)]

    def call(*arrays):
        return [np.asarray(o, d.as_numpy_dtype) for o, (d, _) in zip(fn(*arrays), specs)]
    graph = tf.compat.v1.get_default_graph()
    deps = []
    if _in_v1_graph() and graph in _last_op:
        deps = [_last_op[graph]]
    with tf.control_dependencies(deps):
        outs = tf.numpy_function(call, list(inputs), [d for d, _ in specs], stateful=True,
                                 name="BytePS" + kind)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    if outs and _in_v1_graph():
        _last_op[graph] = outs[0].op
    for o, (_, shape) in zip(outs, specs):
        o.set_shape(shape)
    return list(outs)


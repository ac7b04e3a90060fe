"""TensorFlow <-> numpy plumbing for the collectives of byteps.tensorflow.

An operation is a function of numpy arrays (calling :mod:`byteps.core.collective.ops`) that
:func:`run` calls at once when eager, or wraps in one ``tf.numpy_function`` op inside
``tf.function`` and TF1 graphs.  Everything else here is conversion:

* dtypes: the core's collectives take every dtype of :mod:`byteps.core.collective.carry`'s table as
  numpy arrays and give results back in that dtype; :func:`to_wire` only casts the small
  floats (bfloat16, float8) as the table says, for exchanges that take wire dtypes;
* errors: a disagreement between ranks (the core's BytePSError) is raised as
  :class:`CollectiveError`, a ``tf.errors.FailedPreconditionError`` that is also a
  BytePSError, and an invalid argument found during the exchange (e.g. alltoall splits
  that do not fit, reported by the core on every rank) as :class:`InvalidArgument`, a
  ``tf.errors.InvalidArgumentError`` that is also a ValueError (Horovod's classes), eager,
  in ``tf.function`` and in TF1 sessions.  Inside a graph TensorFlow's ``numpy_function``
  kernel turns a ValueError into InvalidArgumentError but every other exception into
  UnknownError (it ignores an OpError's code), so :func:`graph_fn` marks a BytePSError's
  message and :func:`_install_error_mapping` makes TensorFlow create a CollectiveError
  instead of an UnknownError for a marked message (and only then);
* autograph: never converts byteps' code (:func:`_autograph_leaves_byteps_alone`);
* order: in a TF1 graph every byteps op gets a control dependency on the one built before
  it, so every rank runs them in creation order (``tf.function`` already runs stateful
  ops in program order), and an op that a session run executes only for that chain's
  sake returns without its collective (:mod:`byteps.tensorflow._graph_order`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from byteps.core.api import BytePSError
from byteps.core.collective.carry import wire_dtype
from byteps.tensorflow import _graph_order


def _autograph_leaves_byteps_alone() -> None:
    """Autograph must not rewrite byteps' code (as it leaves TensorFlow's and Keras' alone):
    a user's ``tf.function`` that calls ``tape.gradient`` or a collective would otherwise
    convert the closures byteps hands to ``numpy_function``, and a converted closure loses
    its free variables (``NameError: name 'fn' is not defined`` when the op runs).  byteps
    already builds graph-mode code itself; one rule, added once, before TensorFlow's."""
    from tensorflow.python.autograph.core import config
    if not any(getattr(r, "_prefix", None) == "byteps" for r in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config.DoNotConvert("byteps"),) + config.CONVERSION_RULES


_autograph_leaves_byteps_alone()


_MARK = "[byteps: collective failed] "


class CollectiveError(tf.errors.FailedPreconditionError, BytePSError):
    """The ranks disagree (shapes, dtypes, root ranks, ...) or the job failed; the message
    names the tensor and the ranks.  ``CollectiveError(message)`` or, as TensorFlow builds
    its errors, ``CollectiveError(node_def, op, message)``."""

    def __init__(self, *args):
        node_def, op, message = (None, None, args[0]) if len(args) == 1 else args[:3]
        tf.errors.FailedPreconditionError.__init__(self, node_def, op,
                                                   str(message).replace(_MARK, ""))


class GraphCollectiveError(CollectiveError, tf.errors.UnknownError):
    """A :class:`CollectiveError` raised by a graph op (a session or ``tf.function``): also
    the UnknownError that TensorFlow's ``numpy_function`` kernel reports."""


class CollectiveFailed(Exception):
    """A BytePSError raised inside a graph op, its message marked for the mapping."""


def graph_fn(fn):
    """``fn`` for a ``numpy_function``: a BytePSError that is no ValueError leaves it
    marked, so that the session or ``tf.function`` raises a :class:`CollectiveError`."""
    _install_error_mapping()

    def call(*arrays):
        try:
            return fn(*arrays)
        except BytePSError as exc:
            if isinstance(exc, ValueError):
                raise
            raise CollectiveFailed(_MARK + str(exc)) from None
    return call


def _install_error_mapping() -> None:
    """Make ``tf.errors.UnknownError(node_def, op, message)`` a
    :class:`GraphCollectiveError` when ``message`` carries :data:`_MARK` (TensorFlow builds
    the errors of a failed op from its status code through this class, in sessions and in
    ``tf.function`` alike); every other UnknownError is built as before."""
    cls = tf.errors.UnknownError
    if cls.__dict__.get("_byteps_mapped"):
        return
    base_new = cls.__new__

    def __new__(klass, *args, **kwargs):
        if klass is cls:
            message = args[2] if len(args) > 2 else kwargs.get("message")
            if isinstance(message, str) and _MARK in message:
                klass = GraphCollectiveError       # __init__ follows with the same arguments
        if base_new is object.__new__:
            return base_new(klass)
        return base_new(klass, *args, **kwargs)
    cls.__new__ = __new__
    cls._byteps_mapped = True


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

    graph = tf.compat.v1.get_default_graph()
    if not _in_v1_graph():       # tf.function runs stateful ops in program order
        def call(*arrays):
            return [np.asarray(o, d.as_numpy_dtype) for o, (d, _) in zip(fn(*arrays), specs)]
        outs = tf.numpy_function(graph_fn(call), list(inputs), [d for d, _ in specs],
                                 stateful=True, name="BytePS" + kind)
    else:                        # a TF1 graph: chained in creation order (_graph_order)
        me: list = []

        def call(*arrays):
            *arrays, run_id = arrays
            if not _graph_order.runs(me[0], run_id):     # run for the chain's sake only
                return [np.zeros([k or 0 for k in (s.as_list() if s.rank is not None
                                                   else [])], d.as_numpy_dtype)
                        for d, s in specs]
            return [np.asarray(o, d.as_numpy_dtype) for o, (d, _) in zip(fn(*arrays), specs)]
        with tf.control_dependencies(_graph_order.chain_deps(graph)):
            outs = tf.numpy_function(graph_fn(call),
                                     list(inputs) + [_graph_order.state(graph).run_id],
                                     [d for d, _ in specs], stateful=True, name="BytePS" + kind)
        op = (outs[0] if isinstance(outs, (list, tuple)) else outs).op
        me.append(op.name)
        _graph_order.built(graph, op)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    for o, (_, shape) in zip(outs, specs):
        o.set_shape(shape)
    return list(outs)


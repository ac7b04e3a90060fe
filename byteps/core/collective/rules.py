"""The rules every collective obeys, decided once for every plugin (framework-free).

Plugins (torch, tensorflow/keras, mxnet, numpy) convert tensors and hook autograd or
graphs; the argument rules of a collective are the ones here, with one wording:

* **ops**: Horovod's ``average=``/``op=`` -> the servers' element-wise reduction and an
  average flag (:func:`resolve_op`); which ops each kind of operation accepts
  (:data:`SUM_OR_AVERAGE`: reducescatter and the gradient exchanges sum or average only,
  as Horovod); ``Adasum`` only where Horovod takes it (:data:`ADASUM_KINDS`:
  byteps/core/collective/adasum.py, and the optimizers' algorithm ``bps.algorithms.Adasum``);
* **root rank**: :func:`check_root` (a ValueError, as Horovod's suites expect);
* **names**: :func:`auto_name` for unnamed calls, :func:`position_name` for an
  optimizer's unnamed parameters, :func:`check_name` for given ones.

The dtype rule is :mod:`byteps.core.collective.carry`; the broadcast rule ("zeros except the root,
then a sum") is :func:`byteps.core.api.broadcast_async`; the barrier is
:func:`byteps.core.collective.ops.barrier`; a name used again with another shape or dtype
is :mod:`byteps.core.pipeline.redeclare`'s rule.
"""
from __future__ import annotations

import itertools
import threading

from byteps.common.generation import given as _given
from byteps.common.generation import tag as _generation_tag

__all__ = ["ADASUM", "ADASUM_KINDS", "AVERAGE", "is_adasum", "MAX", "MIN", "PRODUCT", "SUM",
           "SUM_OR_AVERAGE", "ReduceOp",
           "auto_name", "check_name", "check_root", "check_unscaled", "position_name",
           "reset_names", "resolve_op", "sum_or_average"]


class ReduceOp:
    """A Horovod reduction op (``hvd.Sum``, ``hvd.Average``, ``hvd.Min``, ...)."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"hvd.{self.name}"

    def __reduce__(self):
        return (_op_by_name, (self.name,))


AVERAGE, SUM, ADASUM = ReduceOp("Average"), ReduceOp("Sum"), ReduceOp("Adasum")
MIN, MAX, PRODUCT = ReduceOp("Min"), ReduceOp("Max"), ReduceOp("Product")
_OPS_BY_NAME = {o.name.lower(): o for o in (AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT)}
_WIRE = {"sum": 0, "average": 0, "min": 1, "max": 2, "product": 3}

# kinds of operation that only sum or average (as Horovod: reducescatter; and the
# gradient exchanges, whose results are gradients)
SUM_OR_AVERAGE = frozenset({"reducescatter", "grouped_reducescatter", "push_pull",
                            "sparse_allreduce", "DistributedOptimizer",
                            "DistributedGradientTape", "allreduce of tf.IndexedSlices"})


# kinds of operation that take op=Adasum (allreduce: adasum.py; the optimizers: their
# algorithm is bps.algorithms.Adasum, byteps.core.algorithms.resolve)
ADASUM_KINDS = frozenset({"allreduce", "grouped_allreduce", "DistributedOptimizer",
                          "DistributedGradientTape", "DistributedTrainer"})
ADASUM_WIRE = -1        # resolve_op's "server reduction" for Adasum: no server reduces it


def is_adasum(op) -> bool:
    """Whether ``op`` is Horovod's Adasum (the ReduceOp or its name)."""
    name = getattr(op, "name", op)
    return isinstance(name, str) and name.lower() == "adasum"


class UnsupportedOpError(ValueError, NotImplementedError):
    """An op byteps cannot apply (Adasum), or one a kind of operation does not take (Min on
    tf.IndexedSlices): a ValueError, and the RuntimeError Horovod raises for Adasum in
    reducescatter, which is the NotImplementedError it raises for IndexedSlices."""


def _op_by_name(name: str) -> ReduceOp:
    return _OPS_BY_NAME[name.lower()]


def resolve_op(average=None, op=None, kind: str = "allreduce") -> tuple[int, bool]:
    """Horovod's ``average``/``op`` arguments of a ``kind`` of operation -> (server
    reduction, average).

    ``op`` may be a :class:`ReduceOp` or its name; without either argument the result is
    an average (Horovod's default).  ``Adasum`` gives (:data:`ADASUM_WIRE`, False) for the
    kinds in :data:`ADASUM_KINDS` and is refused elsewhere; any op but Average and Sum is
    refused for the kinds in :data:`SUM_OR_AVERAGE`."""
    if op is None:
        return 0, True if average is None else bool(average)
    if average is not None:
        raise ValueError(f"{kind}: give either average= or op=, not both")
    name = getattr(op, "name", op)
    if not isinstance(name, str) or name.lower() not in _OPS_BY_NAME:
        raise ValueError(f"{kind}: op={op!r} is unknown; use Average, Sum, Min, Max or Product")
    key = name.lower()
    if key == "adasum":
        if kind in ADASUM_KINDS:
            return ADASUM_WIRE, False
        raise UnsupportedOpError(f"{kind}: op=Adasum is not supported for {kind} (as Horovod: "
                                 f"it applies to allreduce and the distributed optimizers); "
                                 f"use Average or Sum")
    if kind in SUM_OR_AVERAGE and key not in ("sum", "average"):
        raise UnsupportedOpError(f"{kind}: op={_OPS_BY_NAME[key]!r} is not supported; use Average "
                                 f"or Sum (as Horovod)")
    return _WIRE[key], key == "average"


def check_unscaled(kind: str, prescale_factor=1.0, postscale_factor=1.0) -> None:
    """A ``kind`` of operation that takes no scale factors (Horovod: tf.IndexedSlices)
    refuses them with an :class:`UnsupportedOpError` (NotImplementedError, as Horovod)."""
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise UnsupportedOpError(f"{kind}: prescale_factor/postscale_factor are not supported "
                                 f"(as Horovod); scale the values before or after the call")


def sum_or_average(average=None, op=None, kind: str = "push_pull") -> bool:
    """:func:`resolve_op` for a kind that only sums or averages: True for an average."""
    return resolve_op(average, op, kind if kind in SUM_OR_AVERAGE else "push_pull")[1]


def check_root(root_rank, what: str, size: int, ps=None) -> int:
    """``root_rank`` as an int, when it is a rank of a job of ``size`` workers (and a
    member of the process set ``ps``, when given); else the one ValueError every plugin
    raises."""
    import numpy as np
    if isinstance(root_rank, (bool, np.bool_)) or not isinstance(root_rank, (int, np.integer)) \
            or not 0 <= root_rank < size:
        raise ValueError(f"{what}: root_rank={root_rank!r} is out of range for a job of {size} "
                         f"worker(s); use 0..{size - 1}")
    if ps is not None and int(root_rank) not in ps.ranks:
        raise ValueError(f"{what}: root_rank={root_rank} is not a member of {ps!r}")
    return int(root_rank)


_names: dict[tuple, itertools.count] = {}
_names_lock = threading.Lock()
_gen: list = [None]       # the (epoch, joins, inits in it) the counters count in
_joins: dict[int, int] = {}   # epoch -> join()s completed in it
_inits: dict[int, int] = {}   # epoch -> init() calls made while already in it


def _epoch() -> int:
    from byteps.core import state as _st
    return getattr(getattr(_st.current(), "link", None), "epoch", 0)


def generation() -> tuple:
    """This rank's current ``(epoch, joins, inits)`` (byteps/common/generation.py): its
    heartbeats report it, for the scheduler's "behind" rule."""
    e = _epoch()
    return e, _joins.get(e, 0), _inits.get(e, 0)


def auto_name(kind: str, process_set=None) -> str:
    """A name for an unnamed call: ``<kind>.noname.<n>`` from one per-process counter per
    process set and kind of operation (``.ps<id>`` added for a set other than the global
    one), so every rank of a set must make its unnamed calls of a kind on that set in the
    same order.  The counters start again in every membership epoch (init() after a
    shutdown(), an elastic re-formation), after every join(), where every rank meets, and
    at every init() of a rank already in the job (Horovod's suites call init() at the start
    of every test, without shutdown()), and the names of those later generations carry it
    (``<kind>.noname.e<epoch>j<joins>.<n>``, ``...j<joins>i<inits>.<n>`` after such an
    init(); never a name of an earlier generation, whose reduction op the servers keep): a
    call one rank skipped (an allgather refused while another rank is in join(), a test
    that one rank left early on its own timeout) shifts one counter until the next join()
    or init() only."""
    pid = getattr(process_set, "process_set_id", None) or 0
    gen = generation()
    with _names_lock:
        if _gen[0] != gen:
            _names.clear()
            _gen[0] = gen
        n = next(_names.setdefault((pid, kind), itertools.count()))
    tag = _generation_tag(*gen)
    return f"{kind}.noname.{tag}{n}" if not pid else f"{kind}.noname.ps{pid}.{tag}{n}"


def reset_names(at_init: bool = False) -> None:
    """A join() completed on this rank (on every rank alike), or (``at_init``) init() was
    called by a rank already in the job (every rank calls it at the same point of its
    program): the counters of :func:`auto_name` start a new generation."""
    e = _epoch()
    count = _inits if at_init else _joins
    with _names_lock:
        count[e] = count.pop(e, 0) + 1
        for old in [k for k in count if k != e]:     # earlier epochs are over
            del count[old]


def position_name(i: int, kind: str = "push_pull") -> str:
    """The name of the ``i``-th unnamed parameter of an optimizer (Horovod's convention:
    by position, so it does not depend on other unnamed calls)."""
    return f"{kind}.noname.{i}"


def check_name(name, kind: str, process_set=None) -> str:
    """``name`` when it is a non-empty string (with the generation appended after an init()
    by a rank already in the job: byteps/common/generation.given), :func:`auto_name` when it
    is None; anything else is a ValueError."""
    if name is None:
        return auto_name(kind, process_set)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind}: name must be a non-empty string, got {name!r}")
    return _given(name, *generation())

"""Horovod's collective operations on numpy arrays, with every rule decided once.

Plugins adapt tensors (dtype, device, autograd) and call these; they decide no
policy of their own.  What is decided here:

* **arguments**: names, ops and root ranks by :mod:`byteps.core.collective.rules` (re-exported
  here: :func:`auto_name`, :func:`resolve_op`, :func:`check_root`);
* **dtypes**: every operation takes any dtype of :mod:`byteps.core.collective.carry`'s table and
  gives the result back in the input's dtype (a bool stays a bool), and 0-d arrays where
  an operation allows them (allreduce, broadcast);
* **scaling**: :func:`scale` applies ``prescale_factor``/``postscale_factor`` keeping
  the dtype (integers are scaled in float64 and truncated, float16 in float32, as
  Horovod does); a float16 sum is rounded to float16 once (the servers add in float32),
  then divided or postscaled in float32 and rounded again: Horovod's CPU arithmetic
  (its float16 sum rounds at each step, the same for equal tensors, then it scales by a
  float32 factor), which its test_tensorflow.py references at tolerance 0 with 3 ranks;
* **agreement**: every collective but allreduce first exchanges a small metadata
  row per rank (dtype, shape, root rank, op, splits; a fixed-shape sum), so ranks
  that disagree all get the same error naming both ranks instead of waiting forever;
  the data then travels under a name that carries its shape, so a name may be used
  with another shape on the next call; the metadata sum's name carries its layout too
  (it follows the job's size), so an elastic job's newcomer and the survivors meet under
  one key after a re-formation;
* **async**: every operation has an ``*_async`` form returning a handle for
  :func:`byteps.core.api.synchronize` / :func:`~byteps.core.api.poll`.  Operations of
  more than one exchange run on a thread of their own, so ranks may synchronize
  their handles in different orders.

The data exchanges are sums on the parameter servers: a broadcast is a sum in which
the other ranks contribute zeros, an allgather or alltoall a sum in which every rank
fills its own rows of a zero buffer (exact copies for every dtype).
"""
from __future__ import annotations

import threading

import numpy as np

from byteps.common.errors import BytePSError
from byteps.core.collective import carry as _carry
from byteps.core.collective.rules import (  # noqa: F401
    ADASUM, AVERAGE, MAX, MIN, PRODUCT, SUM, ReduceOp, auto_name, check_name, is_adasum,
    resolve_op)
from byteps.core.collective.rules import check_root as _check_root
from byteps.transport.wire import DTYPES, REDUCE_OPS, dtype_code

__all__ = ["ADASUM", "AVERAGE", "MAX", "MIN", "PRODUCT", "SUM", "ReduceOp", "allgather",
           "allgather_async", "allreduce", "allreduce_async", "alltoall", "alltoall_async",
           "auto_name", "broadcast", "broadcast_async", "build_info", "grouped_allgather",
           "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_async",
           "grouped_reducescatter", "grouped_reducescatter_async", "reducescatter",
           "reducescatter_async", "reducescatter_rows", "resolve_op", "scale"]


def scale(array: np.ndarray, factor: float) -> np.ndarray:
    """``array * factor`` in ``array``'s dtype (a new array; the input when factor is 1).

    Integers are scaled in float64 and truncated toward zero, float16 in float32,
    other floats in their own precision (Horovod's rules)."""
    if factor == 1.0:
        return array
    if array.dtype.kind in "iub":
        return (array.astype(np.float64) * float(factor)).astype(array.dtype)
    if array.dtype == np.float16:
        return (array.astype(np.float32) * np.float32(factor)).astype(np.float16)
    return array * array.dtype.type(factor)


def build_info() -> dict:
    """What this byteps is built with, answered truthfully for Horovod's queries (the
    framework plugins add what depends on the framework, e.g. CUDA): byteps.common.util's
    table."""
    from byteps.common.util import BUILD
    return dict(BUILD)


# ------------------------------------------------------------------ agreement
MAX_DIMS = 32
_KIND, _DTYPE, _NDIM, _ROOT, _OP, _BAD, _DIMS = range(7)
_SPLITS = _DIMS + MAX_DIMS
_KINDS = {"allgather": 1, "broadcast": 2, "reducescatter": 3, "alltoall": 4, "allreduce": 5,
          "barrier": 6}


def _row(kind: str, arr: np.ndarray, root: int = 0, op: int = 0, bad: int = 0,
         splits=None, n: int | None = None) -> np.ndarray:
    n = api.size() if n is None else n
    if arr.ndim > MAX_DIMS:
        raise ValueError(f"{kind}: at most {MAX_DIMS} dimensions, got {arr.ndim}")
    row = np.zeros(_SPLITS + n, np.int64)
    row[[_KIND, _DTYPE, _NDIM, _ROOT, _OP, _BAD]] = [_KINDS[kind], dtype_code(arr.dtype, kind),
                                                     arr.ndim, root, op, bad]
    row[_DIMS:_DIMS + arr.ndim] = arr.shape
    if splits is not None:
        row[_SPLITS:] = splits
    return row


def _meta_start(name: str, row: np.ndarray) -> int:
    """Start the agreement sum of ``name``: one row per rank, so its layout follows the
    job's size.  It travels under a name that carries that layout (as the data does):
    every rank, including one that joined an elastic job later, meets under the same key
    for the same size, whatever sizes the job had before (a name whose first layout was
    another size would be a re-declaration on the survivors only, redeclare.py)."""
    st = api._state()
    meta = np.zeros((st.size, row.size), np.int64)
    meta[st.rank] = row
    return api.push_pull_async(meta, _shape_name(name + ".meta", meta.shape), average=False)


def _check(kind: str, name: str, meta: np.ndarray, trailing: bool = True,
           ranks=None) -> None:
    """Raise the same error on every rank when the ranks' rows disagree (``ranks``: the
    global rank of each row; default row i is rank i)."""
    rk = list(range(meta.shape[0])) if ranks is None else list(ranks)

    def first_diff(values, what, show=str):
        for r in range(1, len(values)):
            if values[r] != values[0]:
                raise BytePSError(f"{kind} of {name!r}: rank {rk[r]} has {what} "
                                  f"{show(values[r])} but rank {rk[0]} has {show(values[0])}; "
                                  f"every rank must agree")
    joined = [rk[r] for r in range(meta.shape[0]) if not meta[r, _KIND]]
    if joined:                       # a joined rank adds zeros: an all-zero row
        raise JoinedRankError(
            f"{kind} of {name!r}: rank(s) {joined} called join() and contribute nothing "
            f"to it; only allreduce may run while a rank has joined (as in Horovod): "
            f"call {kind} before join(), or have every rank call it")
    bad = [r for r in range(meta.shape[0]) if meta[r, _BAD]]
    if bad:
        r = bad[0]
        raise BadArgumentError(
            f"{kind} of {name!r}: rank {rk[r]} passed invalid splits (got "
            f"{meta[r, _SPLITS:].tolist()} for a first dimension of {int(meta[r, _DIMS])}; "
            f"splits must be integers, one count >= 0 per rank, summing to the first "
            f"dimension; without splits the first dimension must divide by the number of "
            f"ranks)")
    first_diff([int(k) for k in meta[:, _KIND]], "operation",
               lambda k: {v: n for n, v in _KINDS.items()}.get(k, k))
    first_diff([int(d) for d in meta[:, _DTYPE]], "dtype", lambda d: DTYPES[d].name)
    first_diff([int(d) for d in meta[:, _NDIM]], "number of dimensions")
    first_diff([int(r) for r in meta[:, _ROOT]], "root_rank")
    first_diff([int(o) for o in meta[:, _OP]], "op",
               lambda o: "average" if o >= len(REDUCE_OPS) else REDUCE_OPS[o])
    nd = int(meta[0, _NDIM])
    lo = 1 if trailing else 0
    first_diff([tuple(meta[r, _DIMS + lo:_DIMS + nd].tolist()) for r in range(len(meta))],
               "trailing dimensions" if trailing else "shape")


class JoinedRankError(BytePSError):
    """A collective other than allreduce while a rank is inside join(): raised on every
    rank that called it (a RuntimeError, as Horovod's)."""


class BadArgumentError(BytePSError, ValueError):
    """A rank passed arguments no rank can use (e.g. alltoall splits): raised on every rank
    by the agreement step, naming that rank (a ValueError, as in Horovod)."""


def _shape_name(name: str, shape) -> str:
    return f"{name}.{'x'.join(map(str, shape)) or 'scalar'}"


def check_root(root_rank, what: str, ps=None) -> int:
    """:func:`byteps.core.collective.rules.check_root` in this job (and process set ``ps``)."""
    return _check_root(root_rank, what, api.size(), ps)


def _flat(a: np.ndarray) -> np.ndarray:
    """The core exchanges arrays of at least one dimension (a 0-d one travels as (1,))."""
    return a.reshape(1) if a.ndim == 0 else a


def _set(process_set):
    """The registered non-global process set of ``process_set`` (None: every rank)."""
    if process_set is None:
        return None
    from byteps.core.collective import process_sets
    return process_sets.resolve(process_set)


def _on_set(ps, kind: str, name: str, fn, done=None) -> int:
    """A set operation (set_ops.py) under ``name``, reserved until synchronized
    (``done``: turns its result into the caller's)."""
    from byteps.core.collective import set_ops
    wait = fn(set_ops)
    return _reserved(kind, name, lambda: _start(kind, wait if done is None else
                                                lambda: done(wait())))


# ------------------------------------------------------------------ allreduce
def allreduce_async(array: np.ndarray, name: str | None = None, average=None, op=None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    priority: int = 0, process_set=None) -> int:
    """Reduce ``array`` over every rank of ``process_set`` (default: all; op default:
    average; ``Adasum``: byteps/core/collective/adasum.py); returns a handle."""
    if is_adasum(op):
        from byteps.core.collective import adasum
        return adasum.allreduce_async(array, name, average, prescale_factor,
                                      postscale_factor, process_set)
    wire, avg = resolve_op(average, op)
    ps = _set(process_set)
    name = check_name(name, "allreduce", process_set)
    given = np.asarray(array)
    a, wire, avg, back = _carry.reduction(api._contiguous(_flat(given)), wire, avg)
    n = api.size() if ps is None else len(ps.ranks)
    idiv = avg and a.dtype.kind in "iu" and n > 1     # Horovod: an integer average truncates
    if idiv:
        avg = False

    src = scale(a, prescale_factor)

    def done(r):
        if idiv:
            r = (r // n + ((r % n != 0) & (r < 0))).astype(r.dtype)    # toward zero
        return back(scale(r, postscale_factor)).reshape(given.shape)
    if ps is not None:
        return _on_set(ps, "allreduce", name, lambda so: so.allreduce(
            ps, name, src, wire, avg, 1.0, 1.0), done)
    if src is a and postscale_factor == 1.0 and back is _carry._identity \
            and given.ndim and not idiv:
        return _reserved("allreduce", name, lambda: api.push_pull_async(
            a, name, average=avg, priority=priority, op=wire))
    return _reserved("allreduce", name, lambda: _start("allreduce", _then(
        api.push_pull_async(src, name, average=avg, priority=priority, op=wire), done)))


def _then(handle: int, fn):
    return lambda: fn(_sync(handle))


def allreduce(array, name=None, average=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None) -> np.ndarray:
    """:func:`allreduce_async` + synchronize."""
    return _sync(allreduce_async(array, name, average, op, prescale_factor, postscale_factor,
                                 process_set=process_set))


def _grouped(kind: str, name: str, arrays: list, one) -> int:
    """One handle over ``one(array, name_i)`` of every array (a list result)."""
    hs = []
    try:
        for i, a in enumerate(arrays):
            hs.append(one(a, f"{name}.{i}"))
    except BaseException:
        for h in hs:                      # the ones already started still complete
            threading.Thread(target=_quiet_sync, args=(h,), daemon=True).start()
        raise
    return _start(kind, lambda: [_sync(h) for h in hs])


def _quiet_sync(h: int) -> None:
    try:
        _sync(h)
    except BaseException:
        pass


def grouped_allreduce_async(arrays: list, name: str | None = None, average=None, op=None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set=None) -> int:
    """Reduce every array of ``arrays`` (one handle; the result is a list)."""
    resolve_op(average, op)
    name = check_name(name, "grouped_allreduce", process_set)
    return _grouped("grouped_allreduce", name, list(arrays), lambda a, n: allreduce_async(
        a, n, average, op, prescale_factor, postscale_factor, process_set=process_set))


def grouped_allreduce(arrays, name=None, average=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None) -> list:
    return _sync(grouped_allreduce_async(arrays, name, average, op, prescale_factor,
                                         postscale_factor, process_set))


# ------------------------------------------------------------------ allgather
def _gather(name: str, a: np.ndarray) -> np.ndarray:
    """Exchange the layouts (every rank's first dimension), check them, move the rows."""
    if a.ndim == 0:
        raise ValueError(f"allgather of {name!r}: the tensor needs at least one dimension")
    meta = _sync(_meta_start(name, _row("allgather", a)))
    _check("allgather", name, meta)
    counts = meta[:, _DIMS]
    r = api.rank()
    total, start = int(counts.sum()), int(counts[:r].sum())
    buf = np.zeros((total, *a.shape[1:]), a.dtype)
    buf[start:start + a.shape[0]] = a
    return _sync(api.push_pull_async(buf, _shape_name(name, buf.shape), average=False))


def allgather_async(array: np.ndarray, name: str | None = None, process_set=None) -> int:
    """Concatenate every rank's ``array`` along the first dimension (which may differ
    between ranks; dtype and the other dimensions must agree)."""
    ps = _set(process_set)
    name = check_name(name, "allgather", process_set)
    a = np.asarray(array)
    if a.ndim == 0:
        raise ValueError(f"allgather of {name!r}: the tensor needs at least one dimension")
    a, back = _carry.carry(api._contiguous(a), copy=True)
    if ps is not None:
        return _on_set(ps, "allgather", name, lambda so: so.allgather(ps, name, a), back)
    return _reserved("allgather", name, lambda: _start("allgather",
                                                       lambda: back(_gather(name, a))))


def allgather(array, name=None, process_set=None) -> np.ndarray:
    return _sync(allgather_async(array, name, process_set))


def grouped_allgather_async(arrays: list, name: str | None = None, process_set=None) -> int:
    """:func:`allgather_async` of every array (one handle; the result is a list)."""
    name = check_name(name, "grouped_allgather", process_set)
    return _grouped("grouped_allgather", name, list(arrays),
                    lambda a, n: allgather_async(a, n, process_set))


def grouped_allgather(arrays, name=None, process_set=None) -> list:
    return _sync(grouped_allgather_async(arrays, name, process_set))


# ------------------------------------------------------------------ broadcast
def broadcast_async(array: np.ndarray, root_rank: int, name: str | None = None,
                    process_set=None) -> int:
    """Rank ``root_rank``'s ``array`` on every rank (checked: every rank must pass the
    same root rank, dtype and shape, else every rank gets an error naming both ranks)."""
    ps = _set(process_set)
    root = check_root(root_rank, "broadcast", ps)
    name = check_name(name, "broadcast", process_set)
    given = np.asarray(array)
    a, back = _carry.carry(api._contiguous(_flat(given)), copy=True)

    def done(r):
        return back(r).reshape(given.shape)
    if ps is not None:
        return _on_set(ps, "broadcast", name, lambda so: so.broadcast(ps, name, a, root), done)

    def run():
        meta = _sync(_meta_start(name, _row("broadcast", a, root=root)))
        _check("broadcast", name, meta, trailing=False)
        return done(_sync(api.broadcast_async(a, root, _shape_name(name, a.shape))))
    return _reserved("broadcast", name, lambda: _start("broadcast", run))


def broadcast(array, root_rank: int, name=None, process_set=None) -> np.ndarray:
    return _sync(broadcast_async(array, root_rank, name, process_set))


# ------------------------------------------------------------------ reducescatter
def reducescatter_rows(n: int, size: int) -> list[tuple[int, int]]:
    """(start, count) of each rank's rows when ``n`` rows are scattered over ``size``
    ranks: as even as possible, the first ``n % size`` ranks get one row more."""
    base, extra = divmod(n, size)
    out, start = [], 0
    for r in range(size):
        c = base + (1 if r < extra else 0)
        out.append((start, c))
        start += c
    return out


def _scatter(name, a, wire, avg, pre, post) -> np.ndarray:
    code = len(REDUCE_OPS) if avg else wire      # average travels as its own code
    _check("reducescatter", name, _sync(_meta_start(name, _row("reducescatter", a, op=code))),
           trailing=False)
    got = _sync(api.push_pull_async(scale(a, pre), _shape_name(name, a.shape), average=avg,
                                    op=wire))
    start, count = reducescatter_rows(a.shape[0], api.size())[api.rank()]
    return scale(got[start:start + count].copy(), post)


def reducescatter_async(array: np.ndarray, name: str | None = None, average=None, op=None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set=None) -> int:
    """Reduce ``array`` over every rank (default: average) and give each rank its block of
    rows (:func:`reducescatter_rows`)."""
    wire, avg = resolve_op(average, op, "reducescatter")
    ps = _set(process_set)
    name = check_name(name, "reducescatter", process_set)
    a = np.asarray(array)
    if a.ndim == 0:
        raise ValueError(f"reducescatter of {name!r}: the tensor needs at least one dimension")
    a, wire, avg, back = _carry.reduction(api._contiguous(a), wire, avg)
    if ps is not None:
        return _on_set(ps, "reducescatter", name, lambda so: so.reducescatter(
            ps, name, a, wire, avg, prescale_factor, postscale_factor), back)
    return _reserved("reducescatter", name, lambda: _start("reducescatter", lambda: back(
        _scatter(name, a, wire, avg, prescale_factor, postscale_factor))))


def reducescatter(array, name=None, average=None, op=None, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=None) -> np.ndarray:
    return _sync(reducescatter_async(array, name, average, op, prescale_factor,
                                     postscale_factor, process_set))


def grouped_reducescatter_async(arrays: list, name: str | None = None, average=None, op=None,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, process_set=None) -> int:
    resolve_op(average, op, "grouped_reducescatter")
    name = check_name(name, "grouped_reducescatter", process_set)
    return _grouped("grouped_reducescatter", name, list(arrays), lambda a, n:
                    reducescatter_async(a, n, average, op, prescale_factor, postscale_factor,
                                        process_set))


def grouped_reducescatter(arrays, name=None, average=None, op=None, prescale_factor=1.0,
                          postscale_factor=1.0, process_set=None) -> list:
    return _sync(grouped_reducescatter_async(arrays, name, average, op, prescale_factor,
                                             postscale_factor, process_set))


# ------------------------------------------------------------------ alltoall
def alltoall_splits(name: str, a: np.ndarray, splits, n: int):
    """(splits as int64[n], bad): equal parts without ``splits``, else the given ones.
    ``bad`` (a first dimension that does not divide, splits that are not integers, not
    one count >= 0 per rank or not summing to the first dimension) is reported to every
    rank by the agreement step, as a :class:`BadArgumentError` naming this rank."""
    if a.ndim == 0:
        raise ValueError(f"alltoall of {name!r}: the tensor needs at least one dimension")
    if splits is None:
        return np.full(n, a.shape[0] // n, np.int64), a.shape[0] % n != 0
    sp = np.asarray(splits)
    if sp.dtype.kind not in "iu":
        return np.zeros(n, np.int64), True
    sp = sp.astype(np.int64).reshape(-1)
    if sp.size != n:
        return np.zeros(n, np.int64), True
    return sp, bool((sp < 0).any()) or int(sp.sum()) != a.shape[0]


def _alltoall(name, a, sp, bad):
    n, r = api.size(), api.rank()
    meta = _sync(_meta_start(name, _row("alltoall", a, bad=int(bad), splits=sp)))
    _check("alltoall", name, meta)
    s = meta[:, _SPLITS:]               # s[j, i]: rows rank j sends to rank i
    starts = np.concatenate([[0], np.cumsum(s.reshape(-1))])  # of (j, i) row-major
    buf = np.zeros((int(s.sum()), *a.shape[1:]), a.dtype)
    mine = int(starts[r * n])
    buf[mine:mine + a.shape[0]] = a
    got = _sync(api.push_pull_async(buf, _shape_name(name, buf.shape), average=False))
    parts = [got[int(starts[j * n + r]):int(starts[j * n + r]) + int(s[j, r])] for j in range(n)]
    return np.concatenate(parts, axis=0), s[:, r].copy()


def alltoall_async(array: np.ndarray, splits=None, name: str | None = None,
                   process_set=None) -> int:
    """Send ``splits[i]`` consecutive rows of ``array`` to rank ``i`` (``splits=None``:
    equal parts; the first dimension must divide by the number of ranks).  The result is
    ``(received rows concatenated by sending rank, received_splits)``."""
    ps = _set(process_set)
    name = check_name(name, "alltoall", process_set)
    a = np.asarray(array)
    sp, bad = alltoall_splits(name, a, splits, api.size() if ps is None else len(ps.ranks))
    a, back = _carry.carry(api._contiguous(a), copy=True)

    def done(r):
        return back(r[0]), r[1]
    if ps is not None:
        return _on_set(ps, "alltoall", name, lambda so: so.alltoall(ps, name, a, sp, bad), done)
    return _reserved("alltoall", name, lambda: _start("alltoall", lambda: done(_alltoall(
        name, a, sp, bad))))


def alltoall(array, splits=None, name=None, process_set=None) -> tuple[np.ndarray, np.ndarray]:
    return _sync(alltoall_async(array, splits, name, process_set))


# ------------------------------------------------------------------ barrier
def barrier(process_set=None) -> None:
    """Wait until every rank of ``process_set`` (default: every worker) gets here."""
    ps = _set(process_set)
    if ps is None:
        api.barrier()
        local = getattr(api._state(), "local", None)
        if local is not None:     # local ranks leave together (byteps/core/local/settle.py)
            local.settle.passed(local._wake, local.join.gen, local.join.flags.count)
        return
    from byteps.core.collective import set_ops
    set_ops.barrier(ps)()


# ------------------------------------------------------------------ handles, api
# imported last: byteps.core.api re-exports this module's names at its end, so whichever
# of the two is imported first, the other finds what it needs
from byteps.core.pipeline import pushpull as api  # noqa: E402  (push_pull and the state below it)
from byteps.core.collective.handles import OPS, release, reset, wait  # noqa: E402,F401
from byteps.core.collective.handles import reserved as _reserved  # noqa: E402
from byteps.core.collective.handles import start as _start  # noqa: E402
from byteps.core.pipeline.pushpull import synchronize as _sync  # noqa: E402

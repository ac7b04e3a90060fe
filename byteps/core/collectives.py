"""Horovod's collective operations on numpy arrays, with every rule decided once.

Plugins adapt tensors (dtype, device, autograd) and call these; they decide no
policy of their own.  What is decided here:

* **names**: :func:`auto_name` for unnamed calls (deterministic when every rank makes
  its unnamed calls in the same order);
* **ops**: :func:`resolve_op` maps Horovod's ``average=``/``op=`` to the servers'
  element-wise reduction (sum, min, max, product) and an average flag; ``Adasum``
  is refused clearly;
* **scaling**: :func:`scale` applies ``prescale_factor``/``postscale_factor`` keeping
  the dtype (integers are scaled in float64 and truncated, float16 in float32, as
  Horovod does);
* **agreement**: every collective but allreduce first exchanges a small metadata
  row per rank (dtype, shape, root rank, op, splits; a fixed-shape sum), so ranks
  that disagree all get the same error naming both ranks instead of waiting forever;
  the data then travels under a name that carries its shape, so a name may be used
  with another shape on the next call;
* **async**: every operation has an ``*_async`` form returning a handle for
  :func:`byteps.core.api.synchronize` / :func:`~byteps.core.api.poll`.  Operations of
  more than one exchange run on a thread of their own, so ranks may synchronize
  their handles in different orders.

The data exchanges are sums on the parameter servers: a broadcast is a sum in which
the other ranks contribute zeros, an allgather or alltoall a sum in which every rank
fills its own rows of a zero buffer (exact copies for every dtype).
"""
from __future__ import annotations

import itertools
import threading

import numpy as np

from byteps.core import api
from byteps.common.errors import BytePSError
from byteps.transport.wire import DTYPES, REDUCE_OPS, dtype_code

__all__ = ["ADASUM", "AVERAGE", "MAX", "MIN", "PRODUCT", "SUM", "ReduceOp", "allgather",
           "allgather_async", "allreduce", "allreduce_async", "alltoall", "alltoall_async",
           "auto_name", "broadcast", "broadcast_async", "build_info", "grouped_allgather",
           "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_async",
           "grouped_reducescatter", "grouped_reducescatter_async", "reducescatter",
           "reducescatter_async", "reducescatter_rows", "resolve_op", "scale"]


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


def _op_by_name(name: str) -> ReduceOp:
    return _OPS_BY_NAME[name.lower()]


def resolve_op(average=None, op=None) -> tuple[int, bool]:
    """Horovod's ``average``/``op`` arguments -> (server reduction, average).

    ``op`` may be a :class:`ReduceOp` or its name; without either argument the result
    is an average (Horovod's default).  ``Adasum`` is refused."""
    if op is None:
        return 0, True if average is None else bool(average)
    if average is not None:
        raise ValueError("give either average= or op=, not both")
    name = getattr(op, "name", op)
    if not isinstance(name, str) or name.lower() not in _OPS_BY_NAME:
        raise ValueError(f"op={op!r} is unknown; use Average, Sum, Min, Max or Product")
    if name.lower() == "adasum":
        raise ValueError("op=Adasum is not supported by byteps (a parameter server reduces "
                         "element-wise); use Average, Sum, Min, Max or Product")
    return _WIRE[name.lower()], name.lower() == "average"


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


_names = itertools.count()
_names_lock = threading.Lock()


def auto_name(kind: str) -> str:
    """A name for an unnamed call: ``<kind>.noname.<n>`` from one per-process counter, so
    every rank must make its unnamed calls in the same order."""
    with _names_lock:
        return f"{kind}.noname.{next(_names)}"


def build_info() -> dict:
    """What this byteps is built with, answered truthfully for Horovod's queries (the
    framework plugins add what depends on the framework, e.g. CUDA)."""
    return {"mpi_built": False, "mpi_enabled": False, "mpi_threads_supported": False,
            "gloo_built": False, "gloo_enabled": False, "nccl_built": False,
            "ddl_built": False, "ccl_built": False, "cuda_built": False,
            "rocm_built": False, "byteps_built": True}


# ------------------------------------------------------------------ handles
class _Op:
    __slots__ = ("id", "event", "error", "result")

    def __init__(self, hid: int):
        self.id, self.event, self.error, self.result = hid, threading.Event(), None, None


OPS: dict[int, _Op] = {}        # handle -> collective in flight (api.synchronize looks here)


def _start(kind: str, fn) -> int:
    """Run ``fn`` (blocking exchanges) on a thread of its own; returns its handle."""
    st = api._state()
    op = _Op(next(st.ids))

    def run():
        try:
            op.result = fn()
        except BaseException as exc:      # re-raised by wait() in the caller's thread
            op.error = exc
        finally:
            op.event.set()
    OPS[op.id] = op
    if st.engine is None:                 # a local job: nothing to wait for
        run()
    else:
        threading.Thread(target=run, name=f"bps-{kind}-{op.id}", daemon=True).start()
    return op.id


def wait(handle: int):
    """Wait for a collective's handle and return its result (or raise its error)."""
    op = OPS[handle]
    op.event.wait()
    OPS.pop(handle, None)
    if op.error is not None:
        raise op.error
    return op.result


def _sync(handle: int):
    return api.synchronize(handle)


# ------------------------------------------------------------------ agreement
MAX_DIMS = 32
_KIND, _DTYPE, _NDIM, _ROOT, _OP, _BAD, _DIMS = range(7)
_SPLITS = _DIMS + MAX_DIMS
_KINDS = {"allgather": 1, "broadcast": 2, "reducescatter": 3, "alltoall": 4}


def _row(kind: str, arr: np.ndarray, root: int = 0, op: int = 0, bad: int = 0,
         splits=None) -> np.ndarray:
    n = api.size()
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
    st = api._state()
    meta = np.zeros((st.size, row.size), np.int64)
    meta[st.rank] = row
    return api.push_pull_async(meta, name + ".meta", average=False)


def _check(kind: str, name: str, meta: np.ndarray, trailing: bool = True) -> None:
    """Raise the same error on every rank when the ranks' rows disagree."""
    def first_diff(values, what, show=str):
        for r in range(1, len(values)):
            if values[r] != values[0]:
                raise BytePSError(f"{kind} of {name!r}: rank {r} has {what} {show(values[r])} "
                                  f"but rank 0 has {show(values[0])}; every rank must agree")
    bad = [r for r in range(meta.shape[0]) if meta[r, _BAD]]
    if bad:
        raise BytePSError(f"{kind} of {name!r}: rank {bad[0]} passed invalid splits "
                          f"{meta[bad[0], _SPLITS:].tolist()} (they must be one count >= 0 per "
                          f"rank summing to its first dimension)")
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


def _shape_name(name: str, shape) -> str:
    return f"{name}.{'x'.join(map(str, shape)) or 'scalar'}"


# ------------------------------------------------------------------ allreduce
def allreduce_async(array: np.ndarray, name: str | None = None, average=None, op=None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    priority: int = 0) -> int:
    """Reduce ``array`` over every rank (default: average); returns a handle."""
    wire, avg = resolve_op(average, op)
    name = name or auto_name("allreduce")
    if prescale_factor == 1.0 and postscale_factor == 1.0:
        return api.push_pull_async(np.asarray(array), name, average=avg, priority=priority,
                                   op=wire)
    src = scale(np.asarray(array), prescale_factor)
    h = api.push_pull_async(src, name, average=avg, priority=priority, op=wire)
    return _start("allreduce", lambda: scale(_sync(h), postscale_factor))


def allreduce(array, name=None, average=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0) -> np.ndarray:
    """:func:`allreduce_async` + synchronize."""
    return _sync(allreduce_async(array, name, average, op, prescale_factor, postscale_factor))


def grouped_allreduce_async(arrays: list, name: str | None = None, average=None, op=None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Reduce every array of ``arrays`` (one handle; the result is a list)."""
    wire, avg = resolve_op(average, op)
    name = name or auto_name("grouped_allreduce")
    hs = [api.push_pull_async(scale(np.asarray(a), prescale_factor), f"{name}.{i}",
                              average=avg, op=wire) for i, a in enumerate(arrays)]
    return _start("grouped_allreduce", lambda: [scale(_sync(h), postscale_factor) for h in hs])


def grouped_allreduce(arrays, name=None, average=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0) -> list:
    return _sync(grouped_allreduce_async(arrays, name, average, op, prescale_factor,
                                         postscale_factor))


# ------------------------------------------------------------------ allgather
def _gather_plan(name: str, arrays: list) -> list:
    """Exchange the layouts of ``arrays`` (every rank's first dimension) and check them."""
    for a in arrays:
        if a.ndim == 0:
            raise ValueError(f"allgather of {name!r}: the tensor needs at least one dimension")
    hs = [_meta_start(f"{name}.{i}", _row("allgather", a)) for i, a in enumerate(arrays)]
    metas = [_sync(h) for h in hs]
    for i, m in enumerate(metas):
        _check("allgather", name if len(arrays) == 1 else f"{name}[{i}]", m)
    return [m[:, _DIMS].copy() for m in metas]


def _gather_data(name: str, a: np.ndarray, counts: np.ndarray) -> int:
    r = api.rank()
    total, start = int(counts.sum()), int(counts[:r].sum())
    buf = np.zeros((total, *a.shape[1:]), a.dtype)
    buf[start:start + a.shape[0]] = a
    return api.push_pull_async(buf, _shape_name(name, buf.shape), average=False)


def _grouped_gather(name: str, arrays: list) -> list:
    counts = _gather_plan(name, arrays)
    hs = [_gather_data(f"{name}.{i}", a, c) for i, (a, c) in enumerate(zip(arrays, counts))]
    return [_sync(h) for h in hs]


def allgather_async(array: np.ndarray, name: str | None = None) -> int:
    """Concatenate every rank's ``array`` along the first dimension (which may differ
    between ranks; dtype and the other dimensions must agree)."""
    name = name or auto_name("allgather")
    a = api._contiguous(np.asarray(array))
    return _start("allgather", lambda: _grouped_gather(name, [a])[0])


def allgather(array, name=None) -> np.ndarray:
    return _sync(allgather_async(array, name))


def grouped_allgather_async(arrays: list, name: str | None = None) -> int:
    """:func:`allgather_async` of every array (one handle; the result is a list)."""
    name = name or auto_name("grouped_allgather")
    arrs = [api._contiguous(np.asarray(a)) for a in arrays]
    return _start("grouped_allgather", lambda: _grouped_gather(name, arrs))


def grouped_allgather(arrays, name=None) -> list:
    return _sync(grouped_allgather_async(arrays, name))


# ------------------------------------------------------------------ broadcast
def check_root(root_rank, what: str) -> int:
    """A root rank valid in this job (the same check for every plugin)."""
    n = api.size()
    if isinstance(root_rank, (bool, np.bool_)) or not isinstance(root_rank, (int, np.integer)) \
            or not 0 <= root_rank < n:
        raise ValueError(f"{what}: root_rank={root_rank!r} is out of range for a job of {n} "
                         f"worker(s); use 0..{n - 1}")
    return int(root_rank)


def broadcast_async(array: np.ndarray, root_rank: int, name: str | None = None) -> int:
    """Rank ``root_rank``'s ``array`` on every rank (checked: every rank must pass the
    same root rank, dtype and shape, else every rank gets an error naming both ranks)."""
    root = check_root(root_rank, "broadcast")
    name = name or auto_name("broadcast")
    a = api._contiguous(np.asarray(array))

    def run():
        meta = _sync(_meta_start(name, _row("broadcast", a, root=root)))
        _check("broadcast", name, meta, trailing=False)
        src = a if api.rank() == root else np.zeros_like(a)
        return _sync(api.push_pull_async(src, _shape_name(name, a.shape), average=False))
    return _start("broadcast", run)


def broadcast(array, root_rank: int, name=None) -> np.ndarray:
    return _sync(broadcast_async(array, root_rank, name))


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


def _grouped_scatter(name, arrays, wire, avg, pre, post) -> list:
    for a in arrays:
        if a.ndim == 0:
            raise ValueError(f"reducescatter of {name!r}: the tensor needs at least one "
                             f"dimension")
    code = len(REDUCE_OPS) if avg else wire      # average travels as its own code
    hs = [_meta_start(f"{name}.{i}", _row("reducescatter", a, op=code))
          for i, a in enumerate(arrays)]
    for i, h in enumerate(hs):
        meta = _sync(h)
        _check("reducescatter", name if len(arrays) == 1 else f"{name}[{i}]", meta,
               trailing=False)
    hs = [api.push_pull_async(scale(a, pre), _shape_name(f"{name}.{i}", a.shape), average=avg,
                              op=wire) for i, a in enumerate(arrays)]
    r, n = api.rank(), api.size()
    out = []
    for a, h in zip(arrays, hs):
        start, count = reducescatter_rows(a.shape[0], n)[r]
        out.append(scale(_sync(h)[start:start + count].copy(), post))
    return out


def reducescatter_async(array: np.ndarray, name: str | None = None, average=None, op=None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Reduce ``array`` over every rank (default: average) and give each rank its block of
    rows (:func:`reducescatter_rows`)."""
    wire, avg = resolve_op(average, op)
    name = name or auto_name("reducescatter")
    a = api._contiguous(np.asarray(array))
    return _start("reducescatter", lambda: _grouped_scatter(name, [a], wire, avg,
                                                            prescale_factor,
                                                            postscale_factor)[0])


def reducescatter(array, name=None, average=None, op=None, prescale_factor=1.0,
                  postscale_factor=1.0) -> np.ndarray:
    return _sync(reducescatter_async(array, name, average, op, prescale_factor,
                                     postscale_factor))


def grouped_reducescatter_async(arrays: list, name: str | None = None, average=None, op=None,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    wire, avg = resolve_op(average, op)
    name = name or auto_name("grouped_reducescatter")
    arrs = [api._contiguous(np.asarray(a)) for a in arrays]
    return _start("grouped_reducescatter",
                  lambda: _grouped_scatter(name, arrs, wire, avg, prescale_factor,
                                           postscale_factor))


def grouped_reducescatter(arrays, name=None, average=None, op=None, prescale_factor=1.0,
                          postscale_factor=1.0) -> list:
    return _sync(grouped_reducescatter_async(arrays, name, average, op, prescale_factor,
                                             postscale_factor))


# ------------------------------------------------------------------ alltoall
def alltoall_async(array: np.ndarray, splits=None, name: str | None = None) -> int:
    """Send ``splits[i]`` consecutive rows of ``array`` to rank ``i`` (``splits=None``:
    equal parts; the first dimension must divide by the number of ranks).  The result is
    ``(received rows concatenated by sending rank, received_splits)``."""
    name = name or auto_name("alltoall")
    a = api._contiguous(np.asarray(array))
    n = api.size()
    if a.ndim == 0:
        raise ValueError(f"alltoall of {name!r}: the tensor needs at least one dimension")
    if splits is None:
        sp = np.full(n, a.shape[0] // n, np.int64)
        bad = a.shape[0] % n != 0
    else:
        sp = np.asarray(splits, dtype=np.int64).reshape(-1)
        bad = sp.size != n or bool((sp < 0).any()) or int(sp.sum()) != a.shape[0]
        if sp.size != n:
            sp = np.zeros(n, np.int64)
    if bad and splits is None:
        raise ValueError(f"alltoall of {name!r}: the first dimension ({a.shape[0]}) must "
                         f"divide by the number of ranks ({n}) when no splits are given")

    def run():
        meta = _sync(_meta_start(name, _row("alltoall", a, bad=int(bad), splits=sp)))
        _check("alltoall", name, meta)
        s = meta[:, _SPLITS:]               # s[j, i]: rows rank j sends to rank i
        r = api.rank()
        total = int(s.sum())
        starts = np.concatenate([[0], np.cumsum(s.reshape(-1))])  # of (j, i) row-major
        buf = np.zeros((total, *a.shape[1:]), a.dtype)
        mine = int(starts[r * n])
        buf[mine:mine + a.shape[0]] = a
        got = _sync(api.push_pull_async(buf, _shape_name(name, buf.shape), average=False))
        parts = [got[int(starts[j * n + r]):int(starts[j * n + r]) + int(s[j, r])]
                 for j in range(n)]
        return np.concatenate(parts, axis=0), s[:, r].copy()
    return _start("alltoall", run)


def alltoall(array, splits=None, name=None) -> tuple[np.ndarray, np.ndarray]:
    return _sync(alltoall_async(array, splits, name))

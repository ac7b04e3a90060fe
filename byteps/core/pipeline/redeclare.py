"""A tensor name used again with another shape, dtype or reduction op (Horovod allows it).

A name's first layout (shape, dtype and reduction op) keeps the name's own key: the servers' check of
that key's declaration is what makes ranks that disagree on a first use fail with an
error naming both ranks.  Any other layout travels under the key of
``<name>#<shape>.<dtype>`` (``.<op>`` added for min, max and product; a new declaration on the servers), so every rank that uses
the name with that layout meets under the same key, whatever it did before and whether
or not it had joined (``join()``) in between: keys follow from the layout only, never
from a per-rank history or counter.

Ranks that use one name with *different* new layouts at the same call would push to
different keys and wait for each other forever.  So every push of a layout other than
the name's first also compares the ranks' layouts (:func:`check`): a small int64 sum
under ``<name>#layouts.<size>.<lane>`` in which each rank writes its layout in its own
slot (ranks that called ``join()`` count as zeros, so they are left out).  The k-th such
push of a name (counted since the rounds last restarted: ``init()``, or every rank's
``join()``, see :func:`reset`) uses lane ``k mod 4``, so every rank meets at the same
call; when the layouts differ, every rank's push_pull of that name fails at once with an
error naming the tensor and each rank's shape.  A rank that uses the name's *first*
layout while another uses a new one still only gets the servers' stall warnings (it
has no reason to compare).
"""
from __future__ import annotations

import threading
import weakref
import zlib
from collections import deque

import numpy as np

from byteps.common.errors import BytePSError
from byteps.transport.wire import DTYPES, REDUCE_OPS

_FIRST: dict[tuple, tuple] = {}    # (job id, name) -> first layout, kept across init()
_FAMILY: dict[str, str] = {}       # "<name>#<shape>.<dtype>" -> name
_LANES = 4                         # checks of one name that may be in flight at once
_DIMS = 8                          # dimensions written out; further ones are hashed
_FIELDS = 4 + _DIMS                # per rank: present, dtype code, ndim, dims, op
_LOCK = threading.Lock()
_SEQ: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # state -> {name: k}
_PENDING: deque = deque()          # checks in flight (_Check), in the order they started
_WAKE = threading.Condition(_LOCK)
_WATCHER: list = []                # the thread that reads their results (started lazily)


def current(st, name: str, src: np.ndarray, op: int = 0) -> str:
    """The name under which ``src`` travels, reduced with ``op`` (the servers' element-wise
    op, 0: sum; see the module docstring).

    The first layouts outlive ``shutdown()``/``init()`` in this process, as the servers'
    declarations outlive a re-formed group of the same job."""
    layout = (tuple(src.shape), src.dtype.str, int(op))
    if _FIRST.setdefault((st.cfg.job_id, name), layout) == layout:
        return name
    new = f"{name}#{'x'.join(map(str, src.shape)) or 'scalar'}.{src.dtype.name}"
    if op:
        new += f".{REDUCE_OPS[op]}"
    _FAMILY[new] = name
    if name in st.declared and new not in st.declared:   # compression given to declare()
        st.declared[new] = st.declared[name]
    return new


def reset(st) -> None:
    """The rounds restarted on every rank (all ranks joined): so do the checks' lanes."""
    with _LOCK:
        _SEQ.pop(st, None)


class _Check:
    __slots__ = ("st", "hid", "out", "name", "tensor", "data_hid")

    def __init__(self, st, hid, out, name, tensor, data_hid):
        self.st, self.hid, self.out, self.name = st, hid, out, name
        self.tensor, self.data_hid = tensor, data_hid


def check(st, t, hid: int, push_pull_async) -> None:
    """After the push_pull ``hid`` of tensor ``t`` started: when ``t`` is a layout other
    than its name's first, start the comparison of every rank's layout for this call
    (``push_pull_async`` is the core's, passed in: this module sits below the API)."""
    name = _FAMILY.get(t.name)
    if name is None or st.engine is None or st.size < 2:
        return
    with _LOCK:
        seq = _SEQ.setdefault(st, {})
        k = seq.get(name, 0)
        seq[name] = k + 1
    cname = f"{name}#layouts.{st.size}.{k % _LANES}"
    prev = st.tensors.get(cname)
    while prev is not None and prev.busy is not None:     # _LANES checks still in flight
        h = st.handles.get(prev.busy)
        if h is None or h.event.wait(0.2) or st.engine.fatal:
            break
    code = np.zeros(st.size * _FIELDS, np.int64)
    code[st.rank * _FIELDS:(st.rank + 1) * _FIELDS] = _encode(t.shape, t.dtype_code, t.op)
    out = np.empty_like(code)
    chid = push_pull_async(code, cname, average=False, out=out)
    with _LOCK:
        _PENDING.append(_Check(st, chid, out, name, t, hid))
        if not _WATCHER or not _WATCHER[0].is_alive():
            _WATCHER[:] = [threading.Thread(target=_watch, name="byteps-redeclare",
                                            daemon=True)]
            _WATCHER[0].start()
        _WAKE.notify()


def _encode(shape: tuple, code: int, op: int = 0) -> np.ndarray:
    dims = list(shape[:_DIMS])
    if len(shape) > _DIMS:            # the rest as one number (named "..." in the error)
        dims[-1] = zlib.crc32(repr(shape[_DIMS - 1:]).encode())
    return np.array([1, code, len(shape)] + dims + [0] * (_DIMS - len(dims)) + [op],
                    np.int64)


def _describe(row: np.ndarray) -> tuple:
    ndim = int(row[2])
    dims = [int(d) for d in row[3:3 + min(ndim, _DIMS)]]
    shape = str(tuple(dims)) if ndim <= _DIMS else \
        "(" + ", ".join(map(str, dims[:-1])) + ", ...)"
    code, op = int(row[1]), int(row[3 + _DIMS])
    dtype = DTYPES[code].name if 0 <= code < len(DTYPES) else f"dtype {code}"
    if op:
        dtype += f" op {REDUCE_OPS[op] if 0 <= op < len(REDUCE_OPS) else op}"
    return shape, dtype


def mismatch(name: str, rows: np.ndarray) -> str | None:
    """The error for one call's layouts (``rows``: one row per rank, zeros for ranks that
    joined), or None when every rank that pushed used the same layout."""
    seen = [(r, _describe(row)) for r, row in enumerate(rows) if row[0]]
    if not seen or all(np.array_equal(rows[r][1:], rows[seen[0][0]][1:]) for r, _ in seen):
        return None
    r0, (s0, d0) = seen[0]
    others = ", ".join(f"rank {r} pushed shape {s} {d}" for r, (s, d) in seen
                       if not np.array_equal(rows[r][1:], rows[r0][1:]))
    return (f"tensor {name!r}: rank {r0} pushed shape {s0} {d0} but {others} at the same "
            f"call (new layouts of the name after its first use); every rank must push "
            f"the same shape, dtype and op under one name at each call")


def _watch() -> None:
    """Read the checks' results as they come back; fail the push_pull of a mismatch."""
    while True:
        with _WAKE:
            while not _PENDING:
                _WAKE.wait()
            first = _PENDING[0]
        h = first.st.handles.get(first.hid)
        if h is not None:
            h.event.wait(0.05)
        with _LOCK:
            items = list(_PENDING)
        for c in items:
            h = c.st.handles.get(c.hid)
            engine = c.st.engine
            if h is not None and not h.event.is_set() and engine.running:
                continue
            with _LOCK:
                _PENDING.remove(c)
            c.st.handles.pop(c.hid, None)
            if h is not None and h.event.is_set() and h.error is None:
                _verdict(c)


def _verdict(c: _Check) -> None:
    msg = mismatch(c.name, c.out.reshape(c.st.size, _FIELDS))
    if msg is None:
        return
    engine = c.st.engine
    engine.key_errors[c.tensor.key] = msg            # later pushes of it fail at once
    h = c.st.handles.get(c.data_hid)
    if h is not None and not h.event.is_set():
        engine.fail_handle(h, BytePSError(msg))

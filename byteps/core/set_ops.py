"""The collectives of a process set smaller than the job (see :mod:`byteps.core.process_sets`).

Each function starts one operation of the set's star and returns a function that waits for
its result.  The rules are those of :mod:`byteps.core.collectives` (the same metadata rows
and checks, the same scaling, averaging and row layouts); only the transport differs.
"""
from __future__ import annotations

import numpy as np

from byteps.core import collectives as c
from byteps.core import process_sets
from byteps.transport.wire import REDUCE_OPS


def _reduce(arrays: list, wire: int, avg: bool) -> np.ndarray:
    """Element-wise reduction of the members' arrays, as the servers and the engine do it
    (an integer average is floor-divided)."""
    ufunc = (np.add, np.minimum, np.maximum, np.multiply)[wire]
    out = arrays[0].copy()
    for a in arrays[1:]:
        ufunc(out, a, out=out)
    if avg and len(arrays) > 1:
        if out.dtype.kind == "f":
            np.divide(out, len(arrays), out=out)
        else:
            np.floor_divide(out, len(arrays), out=out)
    return out


def _run(ps, kind, name, a, row, compute, finish=lambda r, extra: r):
    return process_sets.run(ps, row, a, compute, finish, f"{kind} of {name!r} on {ps!r}")


def allreduce(ps, name, a, wire, avg, pre, post):
    code = len(REDUCE_OPS) if avg else wire
    row = c._row("allreduce", a, op=code, n=len(ps.ranks))

    def compute(meta, arrays, ranks):
        c._check("allreduce", name, meta, trailing=False, ranks=ranks)
        out = _reduce(arrays, wire, avg)
        return [(out, None)] * len(ranks)
    return _run(ps, "allreduce", name, c.scale(a, pre), row, compute,
                lambda r, extra: c.scale(r, post))


def allgather(ps, name, a):
    def compute(meta, arrays, ranks):
        c._check("allgather", name, meta, ranks=ranks)
        out = np.concatenate(arrays, axis=0)
        return [(out, meta[:, c._DIMS])] * len(ranks)
    return _run(ps, "allgather", name, a, c._row("allgather", a, n=len(ps.ranks)), compute)


def broadcast(ps, name, a, root):
    def compute(meta, arrays, ranks):
        c._check("broadcast", name, meta, trailing=False, ranks=ranks)
        return [(arrays[ranks.index(root)], None)] * len(ranks)
    return _run(ps, "broadcast", name, a, c._row("broadcast", a, root=root, n=len(ps.ranks)),
                compute)


def reducescatter(ps, name, a, wire, avg, pre, post):
    code = len(REDUCE_OPS) if avg else wire
    row = c._row("reducescatter", a, op=code, n=len(ps.ranks))

    def compute(meta, arrays, ranks):
        c._check("reducescatter", name, meta, trailing=False, ranks=ranks)
        out = _reduce(arrays, wire, avg)
        rows = c.reducescatter_rows(out.shape[0], len(ranks))
        return [(out[s:s + k], None) for s, k in rows]
    return _run(ps, "reducescatter", name, c.scale(a, pre), row, compute,
                lambda r, extra: c.scale(r, post))


def alltoall(ps, name, a, sp, bad):
    k = len(ps.ranks)
    row = c._row("alltoall", a, bad=int(bad), splits=sp, n=k)

    def compute(meta, arrays, ranks):
        c._check("alltoall", name, meta, ranks=ranks)
        s = meta[:, c._SPLITS:c._SPLITS + k]         # s[j, i]: rows member j sends to i
        offs = np.concatenate([np.zeros((k, 1), np.int64), np.cumsum(s, axis=1)], axis=1)
        out = []
        for i in range(k):
            parts = [arrays[j][offs[j, i]:offs[j, i] + s[j, i]] for j in range(k)]
            out.append((np.concatenate(parts, axis=0), s[:, i].copy()))
        return out
    return _run(ps, "alltoall", name, a, row, compute,
                lambda r, extra: (r, extra[:k].copy()))


def barrier(ps):
    empty = np.zeros(0, np.int32)
    n = ps.ops

    def compute(meta, arrays, ranks):
        c._check("barrier", f"barrier.{n}", meta, trailing=False, ranks=ranks)
        return [(empty, None)] * len(ranks)
    return _run(ps, "barrier", f"barrier.{n}", empty,
                c._row("barrier", empty, n=len(ps.ranks)), compute, lambda r, extra: None)

"""Horovod's Adasum reduction (``op=hvd.Adasum``), on every plugin's ``allreduce``.

Adasum (Maleki et al., 2020; Horovod's docs/adasum_user_guide.rst) combines two vectors
``a`` and ``b`` as ``(1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b``: orthogonal
vectors add, equal ones are taken once, and everything between is in between.  The ranks
are combined pairwise in a binary tree, the pairs of Horovod's vector-halving
distance-doubling levels: ranks (0, 1), (2, 3), ... first, then those pairs' results, and so
on, so the number of ranks must be a power of 2 (as Horovod's).  The dot products and
squared norms are taken in float64 over the whole tensor and a coefficient is 1 when its
norm is below sqrt(DBL_MIN); each level's result is stored in the tensor's dtype before the
next, as Horovod's (horovod/common/ops/adasum/adasum.h).

A parameter server sums element-wise, and Adasum's coefficients need whole vectors, so the
ranks exchange their tensors as an allgather does (:func:`_rows`) and every rank computes
the same tree (the same arithmetic on the same rows, so the results are identical on every
rank).  Each worker thus moves (ranks) times the tensor's size: Adasum costs the bandwidth
of an allgather, not of a push_pull.  A rank inside ``join()`` counts as a zero vector,
which Adasum leaves out.
"""
from __future__ import annotations

import math

import numpy as np

from byteps.core import state as api
from byteps.core.collective.rules import UnsupportedOpError, check_name

_TINY = math.sqrt(np.finfo(np.float64).tiny)       # Horovod's sqrt(DBL_MIN)
FLOATS = (np.float16, np.float32, np.float64)


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two vectors of one float dtype (the result has that dtype)."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, anorm, bnorm = float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= _TINY else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= _TINY else 1.0
    return (acoeff * a64 + bcoeff * b64).astype(a.dtype).reshape(a.shape)


def tree(rows) -> np.ndarray:
    """Adasum of ``rows`` (rank order; a power-of-2 count) in Horovod's pairing."""
    vecs = list(rows)
    d = 1
    while d < len(vecs):
        for i in range(0, len(vecs), 2 * d):
            vecs[i] = combine(vecs[i], vecs[i + d])
        d *= 2
    return vecs[0]


def check(what: str, dtype, ranks: int) -> None:
    """Horovod's conditions for Adasum: a float tensor and a power-of-2 number of ranks
    (every rank raises the same :class:`UnsupportedOpError`)."""
    if np.dtype(dtype) not in [np.dtype(t) for t in FLOATS]:
        raise UnsupportedOpError(f"{what}: op=Adasum takes float16, float32 or float64 "
                                 f"tensors (as Horovod), got {np.dtype(dtype)}")
    if ranks < 1 or ranks & (ranks - 1):
        raise UnsupportedOpError(
            f"{what}: op=Adasum combines the ranks pairwise in a binary tree (as Horovod), "
            f"so it needs a power-of-2 number of ranks; there are {ranks}. Use op=Average, "
            f"or a process set of 2, 4, 8, ... ranks")


def _rows(name: str, row: np.ndarray, process_set) -> np.ndarray:
    """Every rank's ``row`` (1 x n), in rank order: the ranks agree on dtype and shape,
    then one push_pull of a ranks x n buffer in which each rank fills its own row.  A rank
    inside ``join()`` adds zeros there, and a zero vector is neutral in Adasum (its
    coefficient is 1, the other's dot product with it 0), so the ranks still training
    combine their own tensors, as Horovod's joined ranks submit zeros.  A process set's
    rows come from its allgather."""
    from byteps.core.collective import ops
    if process_set is not None:
        return ops.allgather(row, name=f"{name}.adasum", process_set=process_set)
    meta = ops._sync(ops._meta_start(name, ops._row("allreduce", row)))
    live = [r for r in range(meta.shape[0]) if meta[r, 0]]        # 0: the rank has joined
    ops._check("allreduce", name, meta[live], ranks=live)
    buf = np.zeros((meta.shape[0], row.size), row.dtype)
    buf[api.rank()] = row.ravel()
    return ops._sync(ops.api.push_pull_async(buf, ops._shape_name(f"{name}.adasum",
                                                                  buf.shape), average=False))


def allreduce_async(array, name=None, average=None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set=None) -> int:
    """``allreduce(array, op=Adasum)``: the handle of the tree over every rank's
    ``array`` (scaled by ``prescale_factor`` before, ``postscale_factor`` after)."""
    from byteps.core.collective import ops
    if average is not None:
        raise ValueError("allreduce: give either average= or op=, not both")
    ps = ops._set(process_set)
    name = check_name(name, "allreduce", process_set)
    given = np.asarray(array)
    check(f"allreduce of {name!r}", given.dtype, api.size() if ps is None else len(ps.ranks))
    row = given.reshape(1, -1)
    if prescale_factor != 1.0:
        row = (row.astype(np.float64) * prescale_factor).astype(given.dtype)

    def run() -> np.ndarray:
        out = tree(_rows(name, row, process_set))
        if postscale_factor != 1.0:
            out = (out.astype(np.float64) * postscale_factor).astype(given.dtype)
        return out.reshape(given.shape)
    return ops._reserved("allreduce", name, lambda: ops._start("allreduce", run))

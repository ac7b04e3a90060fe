"""The collectives of a process set smaller than the job (see
:mod:`byteps.core.collective.process_sets`).

Each function starts one operation of the set's star and returns a function that waits for
its result.  The rules are those of :mod:`byteps.core.collective.ops` (the same metadata rows
and checks, the same scaling, averaging and row layouts); only the transport differs.

**Compression.**  A sum or average of a name declared with ``compression_params``
(``api.declare``; byteps.torch's ``DistributedOptimizer(process_set=...,
compression_params=...)`` declares its gradients) is compressed as on the servers' path:
each member compresses its tensor (momentum, error feedback, compressor: a worker pipeline
per set and name), the leader decodes every member's frame, sums in float32, compresses the
sum once (error feedback: the servers' pipeline, on the leader) and every member decodes
that same frame (identical results on every member), then divides by the set's size.  The
same rule as the servers' path: floating tensors of at least
``BYTEPS_MIN_COMPRESS_BYTES``; min/max/product are never compressed.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api
from byteps.core.collective import ops as c
from byteps.core.collective import process_sets
from byteps.core.node import BytePSError
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
    comp = _compression(ps, name, a, wire)
    if comp is not None:
        return _compressed_allreduce(ps, name, a, avg, pre, post, row, comp)

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


class _SetCompression:
    """Compression state of one name in one set: this member's worker pipeline, the
    leader's server pipeline (made on first use) and the round counter (every member
    issues the set's operations in the same order, so the rounds agree)."""

    def __init__(self, spec, n: int, key: int):
        from byteps.compression import worker_pipeline
        self.spec, self.n, self.key = spec, n, key
        self.worker = worker_pipeline(spec, n, key, 0)
        self.server = None
        self.rnd = 0


def _compression(ps, name, a, wire) -> _SetCompression | None:
    st = api._state()
    spec = st.declared.get(name)
    if spec is None or wire != 0 or a.dtype.kind != "f" or not a.size \
            or a.nbytes < st.cfg.min_compress_bytes:
        return None
    s = ps.compression.get(name)     # dropped when the set is removed or the job is left
    if s is None or s.n != a.size or s.spec != spec:
        s = ps.compression[name] = _SetCompression(spec, a.size, api.tensor_key(name))
    return s


def _compressed_allreduce(ps, name, a, avg, pre, post, row, s: _SetCompression):
    """Every member's frame, and the reply, end in a status byte (compression's
    ``compress_flagged``): a member's tensor with inf or NaN makes the set's result NaN on
    every member, as an uncompressed sum's would be, the compressors' state kept."""
    from byteps.compression import (CompressionError, compress_flagged, decompress_flagged,
                                    nonfinite_frame, server_pipeline)
    rnd, s.rnd = s.rnd, s.rnd + 1
    k = len(ps.ranks)
    frame = compress_flagged(s.worker, np.asarray(c.scale(a, pre), np.float32).reshape(-1),
                             rnd)
    what = f"compressed allreduce of {name!r} on {ps!r}"

    def compute(meta, frames, ranks):
        c._check("allreduce", name, meta, trailing=False, ranks=ranks)
        if any(f[-1] for f in frames):          # a member's tensor held inf or NaN
            return [(nonfinite_frame(s.worker), None)] * len(ranks)
        total, dec = np.zeros(s.n, np.float32), np.empty(s.n, np.float32)
        for r, f in zip(ranks, frames):
            try:
                decompress_flagged(s.worker, f, rnd, dec)
            except CompressionError as exc:
                raise BytePSError(f"{what}: the frame of rank {r} is invalid ({exc}); every "
                                  f"member must declare {name!r} with the same "
                                  f"compression_params") from None
            total += dec
        if s.server is None:
            s.server = server_pipeline(s.spec, s.n, s.key, 0)
        return [(compress_flagged(s.server, total, rnd), None)] * len(ranks)

    def finish(fr, extra):
        res = np.empty(s.n, np.float32)
        decompress_flagged(s.worker, fr, rnd, res)
        if avg and k > 1:
            res /= k
        return c.scale(res.astype(a.dtype, copy=False).reshape(a.shape), post)
    return process_sets.run(ps, row, frame, compute, finish, what, frame_bytes=frame.nbytes)

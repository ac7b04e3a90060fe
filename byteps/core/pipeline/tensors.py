"""Tensor declarations and the rules checked at each use of a name (split from
:mod:`byteps.core.api`, which re-exports them): ``declare``, a name's compression
settings, reduction op, shape and dtype fixed by its first use, the op checks.
"""
from __future__ import annotations

import numpy as np

from byteps.common.node import BytePSError
from byteps.core import compat
from byteps.transport.wire import REDUCE_OPS


def declare(name: str, compression_params: dict | None = None, **kwargs) -> None:
    """Declare a tensor name (optional: keys come from names, in any order).

    ``compression_params`` (the original BytePS keys, see docs/compression.md) makes
    every later push_pull of ``name`` compressed on the wire.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
    st = _api._state()
    spec = _spec(name, compression_params)
    if spec is not None:
        t = st.tensors.get(name)
        if t is not None and t.asked != spec:
            raise BytePSError(_comp_change(st, name, t.asked, spec))
        st.declared[name] = spec


def _spec(name: str, params):
    """The validated compression Spec of ``params`` (None: uncompressed)."""
    if not params:
        return None
    from byteps import compression
    try:
        spec = compression.parse(params)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"tensor {name!r}: {exc}") from None
    return spec


def _comp_change(st: _api._State, name: str, old, new) -> str:
    def d(s):
        return s.describe() if s is not None else "no compression"
    return (f"tensor {name!r} on rank {st.rank}: compression {d(new)} differs from its first "
            f"use ({d(old)}); a name keeps its compression settings")


def _partition(st: _api._State, arr: np.ndarray, name: str) -> int:
    """Partition size of a tensor the engine pushes itself (with local reduction the
    reducer cuts it, and warns where the size is capped)."""
    return st.cfg.partition_size(arr.nbytes if st.local is None else 0, name)


def _tensor(st: _api._State, name: str, arr: np.ndarray, params=None, op: int = 0) -> _api.Tensor:
    t = st.tensors.get(name)
    if t is None:
        spec = _spec(name, params) if params else st.declared.get(name)
        t = st.tensors[name] = _api.Tensor(name, arr, _partition(st, arr, name),
                                           st.nservers, spec, st.cfg.min_compress_bytes, op)
        if spec is not None:    # rank 0 names those too small or not float, once
            from byteps.core.engine.compression import note_compression
            note_compression(st, t, arr)
    elif t.op != op:
        raise BytePSError(f"tensor {name!r} on rank {st.rank}: reduction "
                          f"{REDUCE_OPS[op]} differs from its first use ({REDUCE_OPS[t.op]}); "
                          f"a name keeps its reduction op")
    elif t.shape != tuple(arr.shape) or t.dtype != arr.dtype:
        raise BytePSError(f"tensor {name!r} on rank {st.rank}: shape {tuple(arr.shape)} "
                          f"{arr.dtype} differs from its first use {t.shape} {t.dtype}; a "
                          f"name must always carry the same shape and dtype")
    elif params:
        spec = _spec(name, params)
        if spec != t.asked:
            raise BytePSError(_comp_change(st, name, t.asked, spec))
    return t


def _check_op(st: _api._State, name: str, op: int, average: bool, params) -> None:
    """min/max/product: element-wise in the local reduction and on the servers, so never
    averaged, compressed or asynchronous (docs/compatibility.md)."""
    if not 0 < op < len(REDUCE_OPS):
        raise ValueError(f"tensor {name!r}: unknown reduction op {op!r}")
    subject = f"tensor {name!r} with op {REDUCE_OPS[op]}"
    if average:
        compat.refuse("op-average", subject)
    if params or st.declared.get(name) is not None:
        compat.refuse("op-compression", subject)
    if st.cfg.enable_async and st.cfg.distributed:
        compat.refuse("async-op", subject)


# last: importing this module first still works (api imports it at its end)
from byteps.core import state as _api  # noqa: E402  (the process state)

"""Dtypes the servers do not carry, carried exactly through one they do (for every plugin).

The wire carries float16/32/64, int32/64, uint8 and int8 (``byteps.transport.wire.DTYPES``).
Horovod's collectives also take bool, int16, uint16, uint32, uint64, bfloat16 and (for
copies) complex numbers.  :func:`carry` maps such an array to a wire dtype and returns the
function that maps the result back:

* **copies** (allgather, broadcast, alltoall: sums in which every other rank adds zeros):
  bool -> uint8, int16/uint16 -> int32, uint32/uint64 -> int64 (exact casts), bfloat16 and
  other small floats -> float32, complex -> pairs of floats (a trailing axis of 2);
* **reductions** (allreduce, reducescatter): int16/uint16 -> int32 and uint32 -> int64
  (sums, min, max and products wrap back to the dtype exactly as its own arithmetic
  would), bfloat16 -> float32 (rounded once at the end); bool and complex are refused by
  the core with its usual error naming the tensor.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from byteps.transport.wire import DTYPES

__all__ = ["carry"]

_WIRE = set(DTYPES)
_INTS = {np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.int32,
         np.dtype(np.uint32): np.int64}
_COPY_INTS = {np.dtype(bool): np.uint8, np.dtype(np.uint64): np.int64, **_INTS}
_COMPLEX = {np.dtype(np.complex64): np.float32, np.dtype(np.complex128): np.float64}


def _identity(a: np.ndarray) -> np.ndarray:
    return a


def carry(array: np.ndarray, copy: bool) -> tuple[np.ndarray, Callable[[np.ndarray],
                                                                      np.ndarray]]:
    """``(wire array, back)``: ``array`` in a dtype the servers carry, and the function that
    turns a result in that dtype back into ``array``'s dtype.  ``copy``: the operation only
    copies values (allgather, broadcast, alltoall), so more dtypes can be carried."""
    dt = array.dtype
    if dt in _WIRE:
        return array, _identity
    table = _COPY_INTS if copy else _INTS
    if dt in table:
        return array.astype(table[dt]), lambda r: r.astype(dt)
    if dt.name == "bfloat16" or dt.name.startswith("float8") or \
            (dt.kind == "f" and dt.itemsize < 2):
        return array.astype(np.float32), lambda r: r.astype(dt)   # ml_dtypes' small floats
    if copy and dt in _COMPLEX:       # (..., 2) floats: the first dimension is kept
        shape = array.shape
        pairs = np.ascontiguousarray(array).reshape(-1).view(_COMPLEX[dt]).reshape(*shape, 2)
        return pairs, lambda r: np.ascontiguousarray(r).reshape(-1).view(dt).reshape(
            r.shape[:-1])
    return array, _identity         # the core refuses it with an error naming the tensor

"""The one dtype table: how every plugin's dtypes travel on the wire.

The wire carries float16/32/64, int32/64, uint8 and int8 (``byteps.transport.wire.DTYPES``).
Every other dtype travels as one of those, by this table, in every plugin (the core's
collectives apply it to numpy arrays; the torch and TensorFlow plugins ask
:func:`wire_dtype` only for dtypes numpy cannot hold, e.g. torch's bfloat16):

* **copies** (allgather, broadcast, alltoall: sums in which every other rank adds zeros):
  bool -> uint8, int16/uint16 -> int32, uint32/uint64 -> int64 (exact casts), bfloat16 and
  other small floats -> float32, complex -> pairs of floats (a trailing axis of 2);
* **reductions** (allreduce, reducescatter, push_pull): int16/uint16 -> int32 and uint32 ->
  int64 (sums, min, max and products wrap back to the dtype exactly as its own arithmetic
  would), bfloat16 -> float32 (rounded once at the end), and bool -> uint8 reduced
  *logically* (:func:`bool_op`: Sum, Average and Max are "any", Min and Product "all",
  as a cast of the numeric result to bool would give, without overflow);
  uint64 and complex are refused by the core with its usual error naming the tensor.

Results always come back in the caller's dtype (a bool stays a bool).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from byteps.transport.wire import DTYPES

__all__ = ["bool_op", "carry", "reduction", "wire_dtype"]

_WIRE_NAMES = frozenset(d.name for d in DTYPES)
_REDUCE_AS = {"bool": "uint8", "int16": "int32", "uint16": "int32", "uint32": "int64"}
_COPY_AS = {**_REDUCE_AS, "uint64": "int64"}
_PAIRS = {"complex64": "float32", "complex128": "float64"}
_WIRE_MAX, _WIRE_MIN = 2, 1          # byteps.transport.wire.REDUCE_OPS


def _small_float(name: str) -> bool:
    return name == "bfloat16" or name.startswith("float8") or name.startswith("float4") \
        or name.startswith("float6")


def wire_dtype(name: str, copy: bool) -> str | None:
    """The name of the wire dtype that carries dtype ``name`` (``name`` itself when the
    wire has it; ``"float32"`` for bfloat16 and the float8 kinds; for a complex dtype
    (copies only) the float dtype of its pairs); None when no rule carries it (the core
    then refuses it, naming the tensor).  ``copy``: the operation only copies values."""
    if name in _WIRE_NAMES:
        return name
    table = _COPY_AS if copy else _REDUCE_AS
    if name in table:
        return table[name]
    if _small_float(name):
        return "float32"
    if copy and name in _PAIRS:
        return _PAIRS[name]
    return None


def bool_op(wire: int, average: bool) -> tuple[int, bool]:
    """(server reduction, average) for bool values carried as uint8: Sum, Average and Max
    are "any" (max), Min and Product are "all" (min)."""
    return (_WIRE_MIN if wire in (_WIRE_MIN, 3) else _WIRE_MAX), False


def _identity(a: np.ndarray) -> np.ndarray:
    return a


def carry(array: np.ndarray, copy: bool) -> tuple[np.ndarray, Callable[[np.ndarray],
                                                                      np.ndarray]]:
    """``(wire array, back)``: ``array`` in a dtype the servers carry (:func:`wire_dtype`),
    and the function that turns a result in that dtype back into ``array``'s dtype.
    ``copy``: the operation only copies values (allgather, broadcast, alltoall).  A bool
    array of a reduction travels as uint8 with the reduction of :func:`bool_op`."""
    dt = array.dtype
    to = wire_dtype(dt.name, copy)
    if to is None or to == dt.name:
        return array, _identity        # (None: the core refuses it with an error naming it)
    if dt.name in _PAIRS:              # (..., 2) floats: the first dimension is kept
        shape = array.shape
        pairs = np.ascontiguousarray(array).reshape(-1).view(np.dtype(to)).reshape(*shape, 2)
        return pairs, lambda r: np.ascontiguousarray(r).reshape(-1).view(dt).reshape(
            r.shape[:-1])
    if dt == np.bool_:
        return array.view(np.uint8), lambda r: r.astype(bool)
    return array.astype(to), lambda r: r.astype(dt)


def reduction(array: np.ndarray, wire: int, average: bool):
    """``(wire array, server reduction, average, back)`` for a reduction of ``array``
    (:func:`carry` with ``copy=False``, and :func:`bool_op` for bool)."""
    out, back = carry(array, copy=False)
    if array.dtype == np.bool_:
        wire, average = bool_op(wire, average)
    return out, wire, average, back

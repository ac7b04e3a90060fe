"""msgpack encoding of Python objects for ``broadcast_object`` (pickle is never used).

Supported: None, bool, int (64-bit), float, str, bytes, list, tuple (kept a
tuple), dict (keys of the same kinds), numpy arrays and scalars of numeric
dtypes, and torch tensors (decoded on the CPU).  Anything else raises a
TypeError naming where it sits in the object, e.g. ``obj['opt'][2]``.

Decoding validates every extension record (dtype from a fixed list, shape of
non-negative ints, byte count) and raises ValueError on malformed input.
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

from byteps.core.collective import codec as _codec

EXT_TUPLE, EXT_NDARRAY, EXT_TENSOR, EXT_NPSCALAR, EXT_SLOT = 1, 2, 3, 4, 5
_NP_KINDS = "biufc"
_TORCH_DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32",
                 "int64", "uint8", "bool", "complex64", "complex128")
SUPPORTED = _codec.SUPPORTED + " and torch tensors"


class Slot:
    """Stands for a tensor sent separately (see broadcast_optimizer_state)."""
    __slots__ = ("dtype", "index", "shape")

    def __init__(self, index: int, dtype: str, shape: tuple):
        self.index, self.dtype, self.shape = index, dtype, shape


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=True)


def _unsupported(path: str, obj, why: str = "") -> TypeError:
    return TypeError(f"broadcast_object: cannot send {path} of type "
                     f"{type(obj).__module__}.{type(obj).__qualname__}{why}; supported: "
                     f"{SUPPORTED}, nested freely; {_codec.FIX}")


def to_wire(obj, path: str = "obj", slots: list | None = None, min_slot_numel: int = 0):
    """Convert ``obj`` to msgpack-ready values.

    With ``slots`` given, tensors of at least ``min_slot_numel`` elements are
    appended to it and replaced by a placeholder record.
    """
    if obj is None or type(obj) in (bool, float, str, bytes):
        return obj
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        if not -(1 << 63) <= obj < (1 << 64):
            raise _unsupported(path, obj, f" (value {obj} does not fit in 64 bits)")
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, (list, dict, np.ndarray)) or _is_tensor(k):
                raise _unsupported(f"a key of {path}", k, " (dict keys must be scalars, "
                                   "strings or tuples)")
            out[to_wire(k, f"a key of {path}")] = to_wire(v, f"{path}[{k!r}]", slots,
                                                          min_slot_numel)
        return out
    if isinstance(obj, list):
        return [to_wire(v, f"{path}[{i}]", slots, min_slot_numel) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return msgpack.ExtType(EXT_TUPLE, _pack(
            [to_wire(v, f"{path}[{i}]", slots, min_slot_numel) for i, v in enumerate(obj)]))
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NP_KINDS:
            raise _unsupported(path, obj, f" (dtype {obj.dtype})")
        arr = np.ascontiguousarray(obj)
        return msgpack.ExtType(EXT_NDARRAY, _pack([arr.dtype.str, list(arr.shape),
                                                   arr.tobytes()]))
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in _NP_KINDS:
            raise _unsupported(path, obj, f" (dtype {obj.dtype})")
        return msgpack.ExtType(EXT_NPSCALAR, _pack([obj.dtype.str, obj.tobytes()]))
    if _is_tensor(obj):
        return _tensor_to_wire(obj, path, slots, min_slot_numel)
    ext = _codec.struct_to_wire(obj, path, lambda v, p: to_wire(v, p, slots, min_slot_numel))
    if ext is not None:           # argparse.Namespace, dataclasses: the core's records
        return ext
    raise _unsupported(path, obj)


def _is_tensor(obj) -> bool:
    mod = type(obj).__module__
    if not (mod.startswith("torch")):
        return False
    import torch
    return isinstance(obj, torch.Tensor)


def _tensor_to_wire(t, path, slots, min_slot_numel):
    import torch
    if t.layout != torch.strided or t.is_quantized:
        raise _unsupported(path, t, f" (layout {t.layout}; only dense tensors)")
    dname = str(t.dtype).replace("torch.", "")
    if dname not in _TORCH_DTYPES:
        raise _unsupported(path, t, f" (dtype {t.dtype})")
    if slots is not None and t.numel() >= min_slot_numel:
        slots.append(t)
        return msgpack.ExtType(EXT_SLOT, _pack([len(slots) - 1, dname, list(t.shape)]))
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return msgpack.ExtType(EXT_TENSOR, _pack([dname, list(t.shape), raw]))


def encode(obj, slots: list | None = None, min_slot_numel: int = 0) -> bytes:
    """Serialize ``obj`` (see the module docstring)."""
    return _pack(to_wire(obj, "obj", slots, min_slot_numel))


# --------------------------------------------------------------------------- decoding
_shape, _np_dtype = _codec.shape, _codec.np_dtype     # the core's record checks


def _fields(data: bytes, n: int, hook) -> list:
    v = msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"expected a {n}-field record, got {type(v).__name__}")
    return v


def _make_hook(allow_slots: bool):
    def hook(code: int, data: bytes):
        if code == EXT_TUPLE:
            v = msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)
            if not isinstance(v, list):
                raise ValueError("bad tuple record")
            return tuple(v)
        if code == EXT_NDARRAY:
            ds, shape, raw = _fields(data, 3, hook)
            dt, shape = _np_dtype(ds), _shape(shape)
            if not isinstance(raw, bytes) or len(raw) != math.prod(shape) * dt.itemsize:
                raise ValueError("array byte count does not match its shape")
            return np.frombuffer(raw, dt).reshape(shape).copy()
        if code == EXT_NPSCALAR:
            ds, raw = _fields(data, 2, hook)
            dt = _np_dtype(ds)
            if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
                raise ValueError("scalar byte count does not match its dtype")
            return np.frombuffer(raw, dt)[0]
        if code == EXT_TENSOR:
            dname, shape, raw = _fields(data, 3, hook)
            return _tensor(dname, _shape(shape), raw)
        if code == EXT_SLOT and allow_slots:
            index, dname, shape = _fields(data, 3, hook)
            if type(index) is not int or index < 0 or dname not in _TORCH_DTYPES:
                raise ValueError("bad tensor slot")
            return Slot(index, dname, _shape(shape))
        got = _codec.struct_from_wire(code, data, lambda d: msgpack.unpackb(
            d, ext_hook=hook, raw=False, strict_map_key=False))
        if got is _codec.NOT_MINE:
            raise ValueError(f"unknown extension type {code}")
        return got
    return hook


def _tensor(dname, shape: tuple, raw):
    import torch
    if dname not in _TORCH_DTYPES:
        raise ValueError(f"tensor dtype {dname!r} is not allowed")
    dt = getattr(torch, dname)
    n = math.prod(shape)
    if not isinstance(raw, bytes) or len(raw) != n * torch.empty((), dtype=dt).element_size():
        raise ValueError("tensor byte count does not match its shape")
    if n == 0:
        return torch.empty(shape, dtype=dt)
    u8 = torch.from_numpy(np.frombuffer(raw, np.uint8).copy())
    return u8.view(dt).reshape(shape)


def decode(data: bytes, allow_slots: bool = False):
    """Inverse of :func:`encode`; raises ValueError on malformed input."""
    try:
        return msgpack.unpackb(data, ext_hook=_make_hook(allow_slots), raw=False,
                               strict_map_key=False)
    except ValueError:
        raise
    except Exception as exc:  # msgpack raises several types for corrupt input
        raise ValueError(f"malformed object data: {exc}") from exc


def fill_slots(obj, values: list):
    """Replace every :class:`Slot` in a decoded object by ``values[slot.index]``."""
    if isinstance(obj, Slot):
        return values[obj.index]
    if isinstance(obj, dict):
        return {k: fill_slots(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [fill_slots(v, values) for v in obj]
    if isinstance(obj, tuple):
        return tuple(fill_slots(v, values) for v in obj)
    return obj


CODEC = (encode, decode)      # for the core's object transport (byteps.core.collective.objects)

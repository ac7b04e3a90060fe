"""msgpack encoding of Python objects for ``broadcast_object`` (pickle is never used).

Supported: None, bool, int (64-bit), float, str, bytes, list, tuple (kept a
tuple), dict (keys of the same kinds), numpy arrays and scalars of numeric
dtypes, and torch tensors (decoded on the CPU).  Anything else raises a
TypeError naming where it sits in the object, e.g. ``obj['opt'][2]``.

Decoding validates every extension record (dtype from a fixed list, shape of
non-negative ints, byte count) and raises ValueError on malformed input.  The walk over
containers and every record but the tensor's are the core codec's
(:mod:`byteps.core.collective.codec`); this module only adds torch tensors to it.
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

from byteps.core.collective import codec as _codec

EXT_TENSOR, EXT_SLOT = 3, 5        # the core codec owns the other codes
_TORCH_DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32",
                 "int64", "uint8", "bool", "complex64", "complex128")
SUPPORTED = _codec.SUPPORTED + " and torch tensors"


class Slot:
    """Stands for a tensor sent separately (see broadcast_optimizer_state)."""
    __slots__ = ("dtype", "index", "shape")

    def __init__(self, index: int, dtype: str, shape: tuple):
        self.index, self.dtype, self.shape = index, dtype, shape


class _Tensors(_codec.Extension):
    """torch tensors in the core codec (codes 3 and 5).  With ``slots`` given, tensors of
    at least ``min_slot_numel`` elements are appended to it and sent as a placeholder
    record; ``allow_slots`` accepts such records on decode."""
    supported = SUPPORTED
    prefix = "broadcast_object: "

    def __init__(self, slots: list | None = None, min_slot_numel: int = 0,
                 allow_slots: bool = False):
        self.slots, self.min_slot_numel, self.allow_slots = slots, min_slot_numel, allow_slots

    def owns(self, obj) -> bool:
        if not type(obj).__module__.startswith("torch"):
            return False
        import torch
        return isinstance(obj, torch.Tensor)

    def to_wire(self, t, path: str):
        import torch
        if t.layout != torch.strided or t.is_quantized:
            raise self.unsupported(path, t, f" (layout {t.layout}; only dense tensors)")
        dname = str(t.dtype).replace("torch.", "")
        if dname not in _TORCH_DTYPES:
            raise self.unsupported(path, t, f" (dtype {t.dtype})")
        if self.slots is not None and t.numel() >= self.min_slot_numel:
            self.slots.append(t)
            return msgpack.ExtType(EXT_SLOT, _codec.pack([len(self.slots) - 1, dname,
                                                          list(t.shape)]))
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return msgpack.ExtType(EXT_TENSOR, _codec.pack([dname, list(t.shape), raw]))

    def from_wire(self, code: int, data: bytes, unpack):
        if code == EXT_TENSOR:
            dname, shape, raw = _codec.fields(unpack(data), 3, "tensor")
            return _tensor(dname, _codec.shape(shape), raw)
        if code == EXT_SLOT and self.allow_slots:
            index, dname, shape = _codec.fields(unpack(data), 3, "tensor slot")
            if type(index) is not int or index < 0 or dname not in _TORCH_DTYPES:
                raise ValueError("bad tensor slot")
            return Slot(index, dname, _codec.shape(shape))
        return _codec.NOT_MINE


def encode(obj, slots: list | None = None, min_slot_numel: int = 0) -> bytes:
    """Serialize ``obj`` (see the module docstring)."""
    return _codec.encode(obj, _Tensors(slots, min_slot_numel))


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
    return _codec.decode(data, _Tensors(allow_slots=allow_slots))


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

"""The object codec of ``broadcast_object`` / ``allgather_object``: plain data as msgpack,
never pickle, validated field by field on decode.

Sent as they are: None, bool, int (64-bit), float, str, bytes, and nested ``list``,
``tuple`` (kept a tuple) and ``dict`` of them; numpy arrays and scalars of numeric dtypes;
``argparse.Namespace`` (Horovod scripts broadcast ``args``) and dataclass instances.  A
plugin adds its own tensors through an :class:`Extension` (``byteps.torch._objects`` for
torch tensors); the walk over containers and every other record are decided here once.

A dataclass travels as its module, qualified name and fields.  The receiver never imports
anything: the class must already be defined in its process (the same script, or imported
before the call); it is looked up in ``sys.modules``, must be a dataclass whose fields are
exactly the record's, and the instance is rebuilt by setting those fields (no
``__init__``/``__post_init__`` runs, as with a copy).  Anything else raises a
``TypeError`` naming where it sits (``obj['opt'].lr``), its type and the fix.

Extension codes 1, 2 and 4 (tuple, array, numpy scalar) are shared with the torch plugin's
codec, which owns 3 and 5 (tensor, tensor slot); 6 and 7 are Namespace and dataclass.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import msgpack
import numpy as np

__all__ = ["CODEC", "SUPPORTED", "Extension", "decode", "encode", "struct_from_wire",
           "struct_to_wire", "unsupported"]

EXT_TUPLE, EXT_NDARRAY, EXT_NPSCALAR, EXT_NAMESPACE, EXT_DATACLASS, EXT_SET = 1, 2, 4, 6, 7, 8
NOT_MINE = object()          # struct_from_wire: the code is not a Namespace or dataclass
_NP_KINDS = "biufc"
SUPPORTED = ("None, bool, int, float, str, bytes, list, tuple, set, frozenset, dict, numpy "
             "arrays/scalars of numeric dtype, argparse.Namespace and dataclass instances")
FIX = ("convert it first (e.g. vars(obj), dataclasses.asdict(obj), a dict of its fields, "
       "array.tolist()); pickle is never used")


def unsupported(path: str, obj, why: str = "", supported: str = SUPPORTED) -> TypeError:
    """The error for a value that cannot be sent: where it is, its type, what can be sent."""
    return TypeError(f"cannot send {path} of type "
                     f"{type(obj).__module__}.{type(obj).__qualname__}{why}; supported: "
                     f"{supported}, nested freely; {FIX}")


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=True)


# --------------------------------------------------------------------------- encoding
def struct_to_wire(obj, path: str, recurse):
    """The record of an ``argparse.Namespace``, dataclass instance, set or frozenset (its
    values converted by ``recurse(value, path)``), or None when ``obj`` is none of them."""
    if type(obj) in (set, frozenset):
        return msgpack.ExtType(EXT_SET, pack([type(obj) is frozenset,
                                              [recurse(v, f"{path}{{}}") for v in obj]]))
    if isinstance(obj, argparse.Namespace):
        fields = vars(obj)
        return msgpack.ExtType(EXT_NAMESPACE, pack(
            {str(k): recurse(v, f"{path}.{k}") for k, v in fields.items()}))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        if "<locals>" in cls.__qualname__:
            raise unsupported(path, obj, " (a dataclass defined inside a function cannot be "
                              "found by the other ranks: define it at module level, or send "
                              "dataclasses.asdict(obj))")
        fields = {f.name: recurse(getattr(obj, f.name), f"{path}.{f.name}")
                  for f in dataclasses.fields(obj)}
        return msgpack.ExtType(EXT_DATACLASS, pack([cls.__module__, cls.__qualname__,
                                                    fields]))
    return None


class Extension:
    """What a framework plugin adds to the codec (``byteps.torch._objects`` for torch
    tensors): its own kinds of value, under its own extension codes.  The walk over
    containers, the plain kinds and the Namespace/dataclass/set records stay the core's."""
    supported = SUPPORTED        # the kinds named in the TypeError of a value none can send
    prefix = ""                  # the start of that error, e.g. "broadcast_object: "

    def owns(self, obj) -> bool:
        """Whether ``obj`` is one of the plugin's kinds (never a dict key)."""
        return False

    def to_wire(self, obj, path: str):
        """The record of an owned ``obj``; TypeError (:meth:`unsupported`) if it cannot go."""
        raise NotImplementedError

    def from_wire(self, code: int, data: bytes, unpack):
        """The value of the plugin's record ``code``, or :data:`NOT_MINE`."""
        return NOT_MINE

    def unsupported(self, path: str, obj, why: str = "") -> TypeError:
        exc = unsupported(path, obj, why, self.supported)
        return TypeError(self.prefix + str(exc)) if self.prefix else exc


_PLAIN = Extension()


def to_wire(obj, path: str = "obj", ext: Extension = _PLAIN):
    """``obj`` as msgpack-ready values (see the module docstring); TypeError naming the part
    that cannot be sent.  ``ext``: a plugin's kinds of value."""
    if obj is None or type(obj) in (bool, float, str, bytes):
        return obj
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        if not -(1 << 63) <= obj < (1 << 64):
            raise ext.unsupported(path, obj, f" (value {obj} does not fit in 64 bits)")
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
            if isinstance(k, (list, dict, np.ndarray)) or ext.owns(k):
                raise ext.unsupported(f"a key of {path}", k, " (dict keys must be scalars, "
                                      "strings or tuples)")
            out[to_wire(k, f"a key of {path}", ext)] = to_wire(v, f"{path}[{k!r}]", ext)
        return out
    if isinstance(obj, list):
        return [to_wire(v, f"{path}[{i}]", ext) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return msgpack.ExtType(EXT_TUPLE, pack([to_wire(v, f"{path}[{i}]", ext)
                                                for i, v in enumerate(obj)]))
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NP_KINDS:
            raise ext.unsupported(path, obj, f" (dtype {obj.dtype}; numeric dtypes only)")
        arr = np.ascontiguousarray(obj)
        return msgpack.ExtType(EXT_NDARRAY, pack([arr.dtype.str, list(arr.shape),
                                                  arr.tobytes()]))
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in _NP_KINDS:
            raise ext.unsupported(path, obj, f" (dtype {obj.dtype}; numeric dtypes only)")
        return msgpack.ExtType(EXT_NPSCALAR, pack([obj.dtype.str, obj.tobytes()]))
    if ext.owns(obj):
        return ext.to_wire(obj, path)
    rec = struct_to_wire(obj, path, lambda v, p: to_wire(v, p, ext))
    if rec is not None:
        return rec
    why = " (a framework tensor: use that framework's plugin, e.g. byteps.torch)" \
        if ext is _PLAIN and type(obj).__module__.split(".")[0] in \
        ("torch", "tensorflow", "mxnet") else ""
    raise ext.unsupported(path, obj, why)


def encode(obj, ext: Extension = _PLAIN) -> bytes:
    """msgpack bytes of ``obj``; TypeError naming the part that cannot be sent."""
    return pack(to_wire(obj, "obj", ext))


# --------------------------------------------------------------------------- decoding
def shape(v) -> tuple:
    if not isinstance(v, list) or len(v) > 64 or \
            not all(type(d) is int and 0 <= d < 1 << 40 for d in v):
        raise ValueError(f"bad shape {v!r}")
    return tuple(v)


def np_dtype(s) -> np.dtype:
    if not isinstance(s, str) or len(s) > 8:
        raise ValueError(f"bad dtype {s!r}")
    try:
        dt = np.dtype(s)
    except TypeError as exc:
        raise ValueError(f"bad dtype {s!r}") from exc
    if dt.kind not in _NP_KINDS:
        raise ValueError(f"dtype {s!r} is not allowed")
    return dt


def _ident(s, what: str) -> str:
    if not isinstance(s, str) or not 0 < len(s) <= 512 or \
            not all(p.isidentifier() for p in s.split(".")):
        raise ValueError(f"bad {what} {s!r}")
    return s


def _dataclass(module: str, qualname: str):
    """The dataclass ``module.qualname`` already loaded in this process (nothing is imported;
    only dictionaries are read, so no attribute hook runs)."""
    cur = sys.modules.get(module)
    for part in qualname.split(".") if cur is not None else ():
        cur = vars(cur).get(part) if hasattr(cur, "__dict__") else None
        if cur is None:
            break
    if cur is None or not isinstance(cur, type) or not dataclasses.is_dataclass(cur):
        raise ValueError(f"dataclass {module}.{qualname} is not defined in this process: "
                         f"define or import it before the call on every rank (classes are "
                         f"never imported from what arrives), or send dataclasses.asdict(obj)")
    return cur


def struct_from_wire(code: int, data: bytes, unpack):
    """The Namespace or dataclass instance of a record (``unpack(data)`` decodes its payload
    with the caller's extension hook), or :data:`NOT_MINE` for another code."""
    if code == EXT_SET:
        v = unpack(data)
        if not isinstance(v, list) or len(v) != 2 or not isinstance(v[1], list):
            raise ValueError("bad set record")
        try:
            return (frozenset if v[0] is True else set)(v[1])
        except TypeError:
            raise ValueError("bad set record: an element is not hashable") from None
    if code == EXT_NAMESPACE:
        v = unpack(data)
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise ValueError("bad Namespace record")
        return argparse.Namespace(**v)
    if code == EXT_DATACLASS:
        v = unpack(data)
        if not isinstance(v, list) or len(v) != 3 or not isinstance(v[2], dict):
            raise ValueError("bad dataclass record")
        module, qualname = _ident(v[0], "module"), _ident(v[1], "class name")
        cls = _dataclass(module, qualname)
        names = [f.name for f in dataclasses.fields(cls)]
        if set(v[2]) != set(names):
            raise ValueError(f"dataclass {module}.{qualname} has fields {names} here but the "
                             f"sender's has {sorted(map(str, v[2]))}: run the same code on "
                             f"every rank")
        obj = object.__new__(cls)
        for k in names:
            object.__setattr__(obj, k, v[2][k])
        return obj
    return NOT_MINE


def fields(v, n: int, what: str) -> list:
    """``v`` checked to be an ``n``-field record."""
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"bad {what} record")
    return v


def _unpacker(ext: Extension):
    def hook(code: int, data: bytes):
        if code == EXT_TUPLE:
            v = unpack(data)
            if not isinstance(v, list):
                raise ValueError("bad tuple record")
            return tuple(v)
        if code == EXT_NDARRAY:
            ds, shp, raw = fields(unpack(data), 3, "array")
            dt, shp = np_dtype(ds), shape(shp)
            if not isinstance(raw, bytes) or len(raw) != math.prod(shp) * dt.itemsize:
                raise ValueError("array byte count does not match its shape")
            return np.frombuffer(raw, dt).reshape(shp).copy()
        if code == EXT_NPSCALAR:
            ds, raw = fields(unpack(data), 2, "scalar")
            dt = np_dtype(ds)
            if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
                raise ValueError("scalar byte count does not match its dtype")
            return np.frombuffer(raw, dt)[0]
        got = ext.from_wire(code, data, unpack)
        if got is NOT_MINE:
            got = struct_from_wire(code, data, unpack)
        if got is NOT_MINE:
            raise ValueError(f"unknown extension type {code}" + (
                " (a tensor: receive it with the plugin that sent it)" if ext is _PLAIN else ""))
        return got

    def unpack(data: bytes):
        return msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)
    return unpack


def decode(data: bytes, ext: Extension = _PLAIN):
    """Inverse of :func:`encode`; ValueError on malformed input."""
    try:
        return _unpacker(ext)(data)
    except ValueError:
        raise
    except Exception as exc:  # msgpack raises several types for corrupt input
        raise ValueError(f"malformed object data: {type(exc).__name__}: {exc}") from None


CODEC = (encode, decode)

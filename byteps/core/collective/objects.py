"""Horovod's ``broadcast_object`` and ``allgather_object`` on plain Python values, for every
plugin (framework-free).

Values travel as msgpack (the core's codec, :mod:`byteps.core.collective.codec`: plain
values, lists, tuples, dicts, numpy arrays and scalars, ``argparse.Namespace`` and
dataclasses), never pickle, over the checked collectives of
:mod:`byteps.core.collective.ops`: a broadcast first agrees on the root rank and the
length, an allgather on every rank's length.  A plugin whose objects hold its own tensors
passes its ``codec`` (``(encode, decode)``, e.g. :data:`byteps.torch._objects.CODEC`); the
transport and its rules stay these.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api
from byteps.core.collective import ops as coll
from byteps.core.collective.codec import CODEC as _CODEC
from byteps.core.collective.codec import SUPPORTED

__all__ = ["allgather_object", "broadcast_object"]



def _decode(raw: bytes, what: str, rank: int, codec=_CODEC):
    try:
        return codec[1](raw)
    except ValueError as exc:
        raise api.BytePSError(f"{what} on rank {api.rank()}: cannot decode the object from "
                              f"rank {rank}: {exc}") from None


def _encode(obj, codec=_CODEC):
    """(bytes, None), or (b"", the error) when ``obj`` cannot be sent: the other ranks are
    told (a length of -1) instead of being left waiting."""
    try:
        return codec[0](obj), None
    except (TypeError, ValueError, OverflowError) as exc:
        return b"", exc


def _failed(what: str, rank: int, err):
    if err is not None and api.rank() == rank:
        text = str(err).removeprefix("broadcast_object: ")
        raise TypeError(f"{what} on rank {rank}: {text}") from err
    return api.BytePSError(f"{what}: rank {rank} could not encode its object (supported: "
                           f"{SUPPORTED}, and the plugin's tensors)")


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, codec=_CODEC, **kw):
    """Rank ``root_rank``'s ``obj`` on every rank (``kw``: ``process_set=``)."""
    root = coll.check_root(root_rank, "broadcast_object", coll._set(kw.get("process_set")))
    name = coll.check_name(name, "broadcast_object", kw.get("process_set"))
    data, err = _encode(obj, codec) if api.rank() == root else (b"", None)
    n = coll.broadcast(np.array([-1 if err else len(data)], np.int64), root, f"{name}.len",
                      **kw)
    length = int(n[0])
    if length < 0:
        raise _failed("broadcast_object", root, err)
    buf = np.frombuffer(data, np.uint8) if api.rank() == root else np.zeros(length, np.uint8)
    if length:
        buf = coll.broadcast(buf, root, f"{name}.data", **kw)
    return _decode(buf.tobytes(), "broadcast_object", root, codec)


def allgather_object(obj, name: str | None = None, codec=_CODEC, **kw) -> list:
    """Every rank's ``obj``, as a list in rank order (``kw``: ``process_set=``)."""
    name = coll.check_name(name, "allgather_object", kw.get("process_set"))
    data, err = _encode(obj, codec)
    lengths = coll.allgather(np.array([-1 if err else len(data)], np.int64), f"{name}.len",
                             **kw)
    bad = [r for r, n in enumerate(lengths.tolist()) if n < 0]
    if bad:
        raise _failed("allgather_object", bad[0], err if err is not None else None)
    raw = coll.allgather(np.frombuffer(data, np.uint8), f"{name}.data", **kw)
    out, start = [], 0
    for r, n in enumerate(lengths.tolist()):
        out.append(_decode(raw[start:start + n].tobytes(), "allgather_object", r, codec))
        start += n
    return out

"""Elastic training state, framework-free: commit, restore, sync (Horovod's ``State``).

``State`` is the interface the plugins' states implement (``TorchState`` in
byteps.torch); ``ObjectState`` keeps plain Python values and numpy arrays given as
keyword arguments; ``NumpyState`` adds a dict of numpy parameter arrays that are
restored and synced in place.  The plugins' states build on these (the Keras one:
:mod:`byteps._keras.elastic`).  Values travel as msgpack (numpy arrays as validated
extension records), never pickle.
"""
from __future__ import annotations

import copy

import msgpack
import numpy as np

from byteps.common.node import BytePSError
from byteps.core import elastic

__all__ = ["State", "ObjectState", "NumpyState", "broadcast_value"]

_EXT_ARRAY = 2
_KINDS = "biufc"


# ---------------------------------------------------------------------- values on the wire
def _default(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _KINDS:
            raise TypeError(f"elastic state: numpy arrays of dtype {obj.dtype} cannot be "
                            f"synced (numeric dtypes only)")
        a = np.ascontiguousarray(obj)
        return msgpack.ExtType(_EXT_ARRAY, msgpack.packb([a.dtype.str, list(a.shape),
                                                          a.tobytes()], use_bin_type=True))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"elastic state: a value of type {type(obj).__module__}."
                    f"{type(obj).__qualname__} cannot be synced; use None, bool, int, float, "
                    f"str, bytes, lists, tuples, dicts and numpy arrays (pickle is never used)")


def _ext(code: int, data: bytes):
    if code != _EXT_ARRAY:
        raise ValueError(f"unknown extension type {code}")
    rec = msgpack.unpackb(data, raw=False)
    if not (isinstance(rec, list) and len(rec) == 3 and isinstance(rec[0], str)
            and isinstance(rec[1], list) and len(rec[1]) <= 32
            and all(type(d) is int and 0 <= d < 1 << 40 for d in rec[1])
            and isinstance(rec[2], bytes)):
        raise ValueError("malformed array record")
    try:
        dt = np.dtype(rec[0])
    except TypeError:
        raise ValueError(f"bad dtype {rec[0]!r}") from None
    if dt.kind not in _KINDS:
        raise ValueError(f"dtype {dt} not allowed")
    n = int(np.prod(rec[1], dtype=np.int64)) if rec[1] else 1
    if n * dt.itemsize != len(rec[2]):
        raise ValueError(f"array record of {len(rec[2])} bytes for shape {rec[1]} {dt}")
    return np.frombuffer(rec[2], dt).reshape(rec[1]).copy()


def encode(obj) -> bytes:
    """msgpack bytes of ``obj`` (plain values, lists, dicts, numpy arrays)."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def decode(data: bytes):
    """The value :func:`encode` made; ValueError on malformed input."""
    try:
        return msgpack.unpackb(data, raw=False, ext_hook=_ext, strict_map_key=False)
    except ValueError:
        raise
    except Exception as exc:        # msgpack raises several types
        raise ValueError(f"not valid msgpack: {type(exc).__name__}") from None


def broadcast_value(obj, name: str, root_rank: int = 0):
    """Rank ``root_rank``'s ``obj`` on every rank (a collective; ``name`` identical on
    every rank)."""
    from byteps.core import api
    is_root = api.rank() == root_rank
    data = encode(obj) if is_root else b""
    n = api.broadcast(np.array([len(data)], np.int64), root_rank, name=name + ".len")
    length = int(n[0])
    buf = np.frombuffer(data, np.uint8).copy() if is_root else np.zeros(length, np.uint8)
    if length:
        buf = api.broadcast(buf, root_rank, name=f"{name}.data.{length}")
    try:
        return decode(buf.tobytes())
    except ValueError as exc:
        raise BytePSError(f"elastic state {name!r} on rank {api.rank()}: data from rank "
                          f"{root_rank} is malformed: {exc}") from None


# ---------------------------------------------------------------------- states
class State:
    """Horovod's elastic ``State``: ``commit()`` saves a copy and lets waiting workers
    in, ``restore()`` goes back to the last commit, ``sync()`` makes every rank equal
    to rank 0, and the reset callbacks run after the group re-formed."""

    def __init__(self):
        self._reset_callbacks: list = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called (without arguments) after every re-formation, e.g. to scale
        the learning rate with ``size()`` or rebuild a data sampler."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for cb in self._reset_callbacks:
            cb()

    def commit(self) -> None:
        """Save the state, then re-form the group here if workers asked to join (raises
        :class:`~byteps.core.elastic.HostsUpdatedInterrupt` on every rank at once)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        elastic.check_host_updates()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Framework clean-up after a re-formation (in-flight handles of the old epoch)."""


class ObjectState(State):
    """Keyword arguments become attributes (``state.epoch``, ``state.batch``) that are
    committed, restored and synced from rank 0.  ``bcast_object(value, name)`` may replace
    the framework-free :func:`broadcast_value` (the torch plugin passes its own)."""

    def __init__(self, bcast_object=None, **kwargs):
        self._bcast_object = bcast_object or broadcast_value
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__()

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, "elastic.object_state")
            self._set_attrs()

    def _set_attrs(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


class NumpyState(ObjectState):
    """``params``: a dict ``{name: numpy array}`` restored and synced **in place** (the
    training loop keeps its references), plus ObjectState's keyword attributes."""

    def __init__(self, params: dict, bcast_object=None, **kwargs):
        if not isinstance(params, dict) or not all(
                isinstance(k, str) and isinstance(v, np.ndarray) for k, v in params.items()):
            raise TypeError("NumpyState(params, ...): params must be a dict of name -> "
                            "numpy array")
        self.params = params
        self._saved_params = {k: v.copy() for k, v in params.items()}
        super().__init__(bcast_object, **kwargs)

    def save(self) -> None:
        for k, v in self.params.items():
            np.copyto(self._saved_params[k], v)
        super().save()

    def restore(self) -> None:
        for k, v in self.params.items():
            np.copyto(v, self._saved_params[k])
        super().restore()

    def sync(self) -> None:
        from byteps.core import api
        for k in sorted(self.params):
            v = self.params[k]
            np.copyto(v, api.broadcast(v, 0, name=f"elastic.param.{k}").reshape(v.shape))
        super().sync()
        self.save()

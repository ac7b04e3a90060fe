"""The worker's process state, the floor of the worker API: one ``State`` per
``init()``, the tensors it has seen (names -> keys, partitions) and the accessors every
stage reads (rank, size, config).  Imports no other worker module but the engine's
types and the partition rule, so every stage above (push_pull, the collectives, the
algorithms) reads the state without an import circle."""
from __future__ import annotations

import hashlib
import itertools
import threading
import weakref

import numpy as np

from byteps.common.config import Config
from byteps.common.errors import BytePSError
from byteps.core.pipeline import partitions as _partitions
from byteps.core.timeline import StepCounter
from byteps.transport.wire import dtype_code


def tensor_key(name: str) -> int:
    """The 63-bit key of a tensor name (identical on every rank)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") \
        & ((1 << 63) - 1)


class Tensor:
    __slots__ = ("name", "key", "dtype_code", "shape", "dtype", "parts", "round", "busy",
                 "spec", "asked", "pipes", "comp_wire", "op", "wire_flags", "layout", "outer")

    def __init__(self, name: str, arr: np.ndarray, partition_bytes: int, nservers: int,
                 spec=None, min_compress_bytes: int = 0, op: int = 0):
        self.name, self.key = name, tensor_key(name)
        self.op = op      # the servers' reduction (wire.REDUCE_OPS): 0 sum, 1 min, 2 max, 3 prod
        self.dtype = arr.dtype
        self.dtype_code = dtype_code(arr.dtype, name)
        self.shape = tuple(arr.shape)
        self.parts = self.cut(partition_bytes, nservers)
        self.layout = 0           # autotune's layout generation (byteps/core/autotune/)
        self.round = 0
        self.busy = None
        # compression: what was asked (``asked``, to check later calls), and what applies
        # (``spec``: floating tensors of at least BYTEPS_MIN_COMPRESS_BYTES)
        self.asked = spec
        on = spec is not None and arr.dtype.kind == "f" and arr.nbytes >= min_compress_bytes
        self.spec = spec if on else None
        self.pipes: dict = {}                 # part -> compression pipeline (engine thread)
        self.comp_wire = spec.to_wire() if on else []
        self.wire_flags = 0       # wire.ASYNC: an asynchronous key (docs/algorithms.md)
        self.outer = None         # [lr, momentum, nesterov]: DiLoCo's key (wire.outer_field)

    def held(self, parts: list | None = None) -> list:
        """``(first element, pipeline)`` of each compressed partition of the current cut
        (or of the cut ``parts``, autotune's previous one)."""
        return [(start, self.pipes[part]) for part, start, _, _ in
                (self.parts if parts is None else parts) if part in self.pipes]

    def cut(self, partition_bytes: int, nservers: int, key: int | None = None) -> list:
        """(part, start, length, server) of each partition; part i on server (key+i) mod S."""
        key = self.key if key is None else key
        per = max(1, partition_bytes // self.dtype.itemsize)
        n = max(1, int(np.prod(self.shape, dtype=np.int64)))
        return _partitions.cut(n, per, nservers, key)    # finer at both ends (fill, drain)


class State:
    """Everything one init() of this process holds (None before init and after
    shutdown)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.ctx = None
        self.link = None
        self.engine = None          # byteps.core.engine.Engine (None: one process)
        self.rank, self.size = 0, 1
        self.tensors: dict[str, Tensor] = {}
        self.handles: dict = {}      # handle id -> engine Handle
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.barrier_n = itertools.count()
        self.nservers = 1
        self.book: dict = {}
        self.local = None        # byteps.core.local.reducer.LocalReducer (local reduction)
        self.steps = StepCounter()   # training steps: step_done(), the trace window
        self.declared: dict = {}  # name -> compression Spec given to declare()
        self.hvd_timeline = None      # Horovod's timeline on rank 0 (hvd_timeline.py)
        self.tuner = None        # byteps.core.autotune.Tuner (BYTEPS_AUTOTUNE)
        self.peers = None        # byteps.core.algorithms.peers.PeerNet (decentralized algorithms)
        self.join_hooks: list = []    # (before, after) of stages that quiesce around join()
        self.last_joined: int | None = None   # what the last join() returned


#: objects whose ``_bps_before_shutdown()`` runs first in shutdown(), while the job is still
#: there (torch's CrossBarrier: updates still in flight are applied, not lost)
BEFORE_SHUTDOWN: "weakref.WeakSet" = weakref.WeakSet()

_State = State            # the name older code uses
_STATE: State | None = None
#: collective operations in flight (handle -> op), filled by byteps.core.collective.handles;
#: push_pull's poll/synchronize look here first
OPS: dict = {}


def current() -> State | None:
    """This process's state, or None when not initialized."""
    return _STATE


def set_current(st: State | None) -> None:
    global _STATE, _SUSPENDED, _LAST
    _STATE = st
    if st is not None:
        _SUSPENDED = None
        _LAST = ids()


#: ids() of the last init(), kept after shutdown() (byteps.run orders results by it)
_LAST: tuple | None = None


def last_ids() -> tuple | None:
    """(rank, size, local rank, local size) of this process's last init(), or None."""
    return _LAST


#: (rank, size, local rank, local size) from suspend() until the next init: the original
#: BytePS answers rank() and size() between suspend() and resume(), and its elastic
#: example logs with them there
_SUSPENDED: tuple | None = None


def keep_ids_while_suspended(ids: tuple | None) -> None:
    """After suspend()'s shutdown: rank(), size(), local_rank() and local_size() answer
    ``ids`` (what they answered before) until init() or resume()."""
    global _SUSPENDED
    _SUSPENDED = ids


def ids() -> tuple | None:
    """(rank, size, local rank, local size) of this process, None when not initialized."""
    if _STATE is None:
        return _SUSPENDED
    return _STATE.rank, _STATE.size, _STATE.cfg.local_rank, _STATE.cfg.local_size


def _ids() -> tuple:
    found = ids()
    if found is None:
        _state()           # raises "not initialized"
    return found


def _state() -> State:
    if _STATE is None:
        raise BytePSError("BytePS is not initialized; call bps.init() first")
    return _STATE


def is_initialized() -> bool:
    return _STATE is not None


def get_config() -> Config:
    return _state().cfg


def rank() -> int:
    """Global rank of this worker process."""
    return _ids()[0]


def size() -> int:
    """Number of worker processes in the job."""
    return _ids()[1]


def local_rank() -> int:
    return _ids()[2]


def local_size() -> int:
    return _ids()[3]


class NameInFlightError(BytePSError, ValueError):
    """A name was used again before its previous operation was synchronized (Horovod
    raises ValueError for this; it is also a BytePSError)."""


def _contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)

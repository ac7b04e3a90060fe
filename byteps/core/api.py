"""The framework-free worker API that every plugin builds on.

Arrays are numpy arrays.  ``push_pull_async`` returns an integer handle;
``synchronize`` waits and returns the result.  Keys come from tensor
*names* (never from declaration order), so ranks may declare in any order.
With one worker and no ``DMLC_*`` variables, everything runs locally
without a network (like the original BytePS).
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading

import numpy as np
import zmq

from byteps.core import autotune as _autotune
from byteps.core import local as _local
from byteps.core import worker_metrics
from byteps.core import partitions as _partitions
from byteps.core import redeclare as _redeclare
from byteps.common.config import Config
from byteps.core.engine import Engine, Handle, Task, comp_pipeline
from byteps.core.engine_servers import colocated_config
from byteps.common.logs import setup_logging
from byteps.common.node import BytePSError, SchedulerLink
from byteps.common.summary import write_summary
from byteps.core.timeline import StepCounter, Timeline
from byteps.common.torchrun import warn_if_torchrun_without_byteps
from byteps.transport.wire import ASYNC, dtype_code

log = logging.getLogger("byteps.worker")

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "declare", "push_pull_async", "push_pull", "poll", "synchronize", "broadcast",
           "broadcast_async", "barrier", "join", "BytePSError", "tensor_key", "get_config",
           "get_pushpull_speed", "set_compression_lr"]


def tensor_key(name: str) -> int:
    """The 63-bit key of a tensor name (identical on every rank)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") \
        & ((1 << 63) - 1)


class Tensor:
    __slots__ = ("name", "key", "dtype_code", "shape", "dtype", "parts", "round", "busy",
                 "spec", "asked", "pipes", "comp_wire", "op", "wire_flags", "layout")

    def __init__(self, name: str, arr: np.ndarray, partition_bytes: int, nservers: int,
                 spec=None, min_compress_bytes: int = 0, op: int = 0):
        self.name, self.key = name, tensor_key(name)
        self.op = op      # the servers' reduction (wire.REDUCE_OPS): 0 sum, 1 min, 2 max, 3 prod
        self.dtype = arr.dtype
        self.dtype_code = dtype_code(arr.dtype, name)
        self.shape = tuple(arr.shape)
        self.parts = self.cut(partition_bytes, nservers)
        self.layout = 0           # autotune's layout generation (byteps/core/autotune.py)
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

    def cut(self, partition_bytes: int, nservers: int, key: int | None = None) -> list:
        """(part, start, length, server) of each partition; part i on server (key+i) mod S."""
        key = self.key if key is None else key
        per = max(1, partition_bytes // self.dtype.itemsize)
        n = max(1, int(np.prod(self.shape, dtype=np.int64)))
        return _partitions.cut(n, per, nservers, key)    # finer at both ends (fill, drain)


class _State:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.ctx = None
        self.link = None
        self.engine: Engine | None = None
        self.rank, self.size = 0, 1
        self.tensors: dict[str, Tensor] = {}
        self.handles: dict[int, Handle] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.barrier_n = itertools.count()
        self.nservers = 1
        self.book: dict = {}
        self.local = None        # byteps.core.local.reducer.LocalReducer (local reduction)
        self.steps = StepCounter()   # training steps: step_done(), the trace window
        self.declared: dict = {}  # name -> compression Spec given to declare()
        self.user_timeline = None     # start_timeline() (Horovod's name)
        self.tuner = None        # byteps.core.autotune.Tuner (BYTEPS_AUTOTUNE)
        self.peers = None        # byteps.core.peers.PeerNet (decentralized algorithms)
        self.join_hooks: list = []    # (before, after) of stages that quiesce around join()
        self.last_joined: int | None = None   # what the last join() returned


_STATE: _State | None = None
_LAST_LINK: dict | None = None
_FAILED: list = []
_INIT_LOCK = threading.Lock()


def init(lazy: bool = False) -> None:
    """Join the job described by the environment (see docs/configuration.md)."""
    global _STATE, _LAST_LINK
    with _INIT_LOCK:
        if _STATE is not None:
            return
        cfg = Config.from_env()
        setup_logging(cfg, "worker")
        warn_if_torchrun_without_byteps(cfg.distributed, os.environ)
        st = _State(cfg)
        st.rank = cfg.local_rank
        if cfg.distributed:
            st.ctx = zmq.Context()
            ident = _identity(cfg)
            st.link = SchedulerLink(cfg, st.ctx, "worker", ident)
            try:
                from byteps.core import peers as _peers
                peer_sock, peer_addr = _peers.listen(cfg, st.ctx)
                book = st.link.register({"local_reduce": cfg.local_reduce,
                                         "tuning": _autotune.settings(cfg), "address": peer_addr},
                                        f"worker (host {cfg.host_id}, local rank "
                                        f"{cfg.local_rank})")
                st.book = book
                st.rank, st.size = book["rank"], book["size"]
                st.nservers = len(book["servers"])
                cfg = st.cfg = colocated_config(cfg, book)      # one machine: larger cuts
                st.engine = Engine(cfg, st.ctx, st.link, book)
                if peer_sock is not None:       # worker-to-worker links (byteps/core/peers.py)
                    st.peers = _peers.PeerNet(cfg, st.ctx, peer_sock, peer_addr, st.link.secret)
                    st.peers.attach(book, st.link.node_id, st.link.epoch,
                                    lambda eng=st.engine: eng.fatal)
                if cfg.trace_on:
                    st.engine.timeline = Timeline(cfg.trace_dir, st.rank, st.size,
                                                  cfg.trace_start_step, cfg.trace_end_step,
                                                  steps=st.steps)
                if _local.enabled(cfg):
                    st.local = _local.start(cfg, st.engine, book, st.link.epoch)
                st.tuner = _autotune.start(cfg, st)
            except BaseException as exc:
                if st.engine is not None:
                    st.engine.stop(leave=False)
                st.link.close()
                st.ctx.destroy(linger=0)      # closes any socket still open; never blocks
                if _LAST_LINK is not None and isinstance(exc, BytePSError) and \
                        "unreachable" in str(exc):
                    raise BytePSError(
                        f"{exc}. This process called shutdown() before: a job ends "
                        f"BYTEPS_REINIT_WAIT_S={cfg.reinit_wait_s:g} s after all of its workers "
                        f"called shutdown() unless one calls init() again") from None
                raise
            _LAST_LINK = {"cfg": cfg, "node_id": st.link.node_id, "epoch": st.link.epoch,
                          "identity": ident}
            from byteps.core.api_exit import install_exit_hooks
            install_exit_hooks()
        _STATE = st
        if st.engine is not None:
            # BYTEPS_METRICS_PORT, bpslaunch's live view: they read the current state
            worker_metrics.start(cfg, st.rank, lambda: _STATE)


def shutdown() -> None:
    """Leave the job; ``init()`` may be called again afterwards."""
    global _STATE
    with _INIT_LOCK:
        st, _STATE = _STATE, None
    if st is None or st.engine is None:
        return
    if st.tuner is not None:
        st.tuner.release()
    _finish(st)
    if st.peers is not None:
        st.peers.close()
    if st.local is not None:
        st.local.close()
    from byteps.core.elastic import allow_stop
    allow_stop(st.engine)          # a lost worker's interrupt (elastic) does not block it
    st.engine.stop(leave=True)
    st.link.close(linger_ms=2000)     # the LEAVE must reach the scheduler
    st.ctx.term()


def _state() -> _State:
    if _STATE is None:
        raise BytePSError("BytePS is not initialized; call bps.init() first")
    return _STATE


def is_initialized() -> bool:
    return _STATE is not None


def get_config() -> Config:
    return _state().cfg


def rank() -> int:
    """Global rank of this worker process."""
    return _state().rank


def size() -> int:
    """Number of worker processes in the job."""
    return _state().size


def local_rank() -> int:
    return _state().cfg.local_rank


def local_size() -> int:
    return _state().cfg.local_size


def push_pull_async(array: np.ndarray, name: str, average: bool = True, priority: int = 0,
                    out: np.ndarray | None = None, compression_params: dict | None = None,
                    op: int = 0, asynchronous: bool = False, uncompressed: bool = False) -> int:
    """Start summing (or averaging) ``array`` across all workers; returns a handle.

    Higher ``priority`` goes first.  The input must not change until the
    handle is synchronized.  ``out`` may be ``array`` itself (in place).
    ``compression_params`` (first use of a name fixes them, as does ``declare``)
    compresses what leaves the host; see docs/compression.md.
    ``op`` is the servers' element-wise reduction (``wire.REDUCE_OPS``: 0 sum, 1 min,
    2 max, 3 product; plugins resolve Horovod's ``op=`` with
    :func:`byteps.core.collectives.resolve_op`).

    ``asynchronous=True`` (the numpy API and the async algorithms set it with
    ``BYTEPS_ENABLE_ASYNC=1``): the servers add ``array`` (a delta) to the value they
    hold for ``name`` at once and the result is their current value, with no rounds
    and no averaging (``average=True`` is an error); ``BYTEPS_ASYNC_STALENESS`` bounds
    how far a worker may run ahead (docs/algorithms.md).  A compressed asynchronous name
    pushes compressed deltas (error feedback on this worker) and pulls the servers' value
    uncompressed; ``uncompressed=True`` pushes this one array exactly (AsyncPS's seeds
    and pulls: parameters and zeros, where compression would lose the model).
    """
    st = _state()
    if not isinstance(name, str) or not name:
        raise ValueError(f"push_pull needs a tensor name, got {name!r}")
    if asynchronous:
        from byteps.core.algorithms.async_ps import check_async
        check_async(st, name, average, op, compression_params)
    elif uncompressed:
        raise ValueError(f"tensor {name!r}: uncompressed=True is for asynchronous pushes "
                         f"(a synchronous round sums every rank's compressed push)")
    if op:
        _check_op(st, name, op, average, compression_params)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"tensor {name!r}: expected a numpy array, got {type(array).__name__}")
    src = _contiguous(array)
    if out is None:
        out = np.empty_like(src)
    elif out.shape != src.shape or out.dtype != src.dtype or not out.flags.c_contiguous:
        raise ValueError(f"tensor {name!r}: out must be a C-contiguous {src.dtype} array of "
                         f"shape {src.shape}")
    if not asynchronous:                # a name used again with another layout: its own key
        name = _redeclare.current(st, name, src)
    new = name not in st.tensors
    t = _tensor(st, name, src, compression_params, op)
    if new and asynchronous:
        t.wire_flags = ASYNC
    if bool(t.wire_flags & ASYNC) != bool(asynchronous):
        from byteps.core.algorithms.async_ps import mode_change
        raise BytePSError(mode_change(st, name, asynchronous))
    st.steps.pushed(name)
    if st.tuner is not None:
        _autotune.relayout(st, t, src.nbytes)
    hid = next(st.ids)
    if st.engine is None or (src.size == 0 and not asynchronous):   # nothing to exchange
        h = Handle(hid, t, out, 0, average)
        if asynchronous:        # one process: the "servers' value" is kept here
            from byteps.core.algorithms.async_ps import local_add
            src = local_add(st, name, src)
        if out is not src:
            np.copyto(out, src)
        h.event.set()
        st.handles[hid] = h
        return hid
    err = st.engine.key_errors.get(t.key)
    if err:
        raise BytePSError(err)
    with st.lock:
        if t.busy is not None:
            raise NameInFlightError(
                f"tensor {name!r} is already in flight on rank {st.rank} (handle {t.busy}); "
                f"synchronize() it before pushing the name again, or use a distinct name")
        t.busy = hid
    if st.local is not None:            # local reduction: shared memory, then the network
        try:
            st.handles[hid] = st.local.submit(hid, t, src, out, average, priority,
                                              raw=uncompressed)
        except BaseException:
            t.busy = None
            raise
        _redeclare.check(st, t, hid, push_pull_async)   # ranks agree on a re-used name
        return hid
    h = Handle(hid, t, out, len(t.parts), average)
    if st.engine.timeline is not None:
        st.engine.timeline.begin(hid, name, h.t0)
    flat = src.reshape(-1)
    tasks = []
    seq = next(st.ids)
    # incast: every rank starts on a different server (rank r first pushes the partition
    # placed on server r mod S), then goes round the tensor from there
    nparts = len(t.parts)
    first = (st.rank - t.key) % max(1, st.nservers) % nparts
    for part, start, length, server in t.parts:
        tasks.append(Task(h, part, start, length, server, t.round, flat[start:start + length],
                          -priority, seq, order=(part - first) % nparts,
                          comp=None if uncompressed else comp_pipeline(t, part, length)))
    t.round += 1
    st.handles[hid] = h
    try:
        if st.tuner is None or not st.tuner.defer(tasks):   # autotune may hold them
            st.engine.submit(tasks)
    except BytePSError:
        t.busy = None
        del st.handles[hid]
        raise
    _redeclare.check(st, t, hid, push_pull_async)       # ranks agree on a re-used name
    return hid


class NameInFlightError(BytePSError, ValueError):
    """A name was used again before its previous operation was synchronized (Horovod
    raises ValueError for this; it is also a BytePSError)."""


def _contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished."""
    from byteps.core import collectives
    if handle in collectives.OPS:
        return collectives.OPS[handle].event.is_set()
    h = _handle(handle)
    if _STATE is not None and _STATE.tuner is not None:
        _STATE.tuner.release()        # partitions autotune held go out at the first wait
    return h.event.is_set()


def synchronize(handle: int) -> np.ndarray:
    """Wait for ``handle`` and return the result (raises BytePSError on failure).

    Handles of the collectives in :mod:`byteps.core.collectives` return their result
    (an array, a list of arrays, or ``(array, received_splits)`` for alltoall)."""
    from byteps.core import collectives
    if handle in collectives.OPS:
        return collectives.wait(handle)
    st = _state()
    h = _handle(handle)
    if st.tuner is not None:
        st.tuner.release()            # partitions autotune held go out at the first wait
    while not h.event.wait(0.5):
        if st.engine is not None and st.engine.fatal:
            st.engine.fail_handle(h, st.engine.fatal)
    st.handles.pop(handle, None)
    collectives.release(handle)         # a name reserved by collectives.allreduce_async
    if h.error is not None:
        raise BytePSError(str(h.error))
    return h.out


def step_done(implicit: bool = False) -> None:
    """This worker's current training step ended (plugins call it from their optimizer's
    step; numpy users may too).  The timeline's trace window counts these steps; see
    :class:`byteps.core.timeline.StepCounter`.  ``implicit`` (numpy ``synchronize``)
    counts only when nothing is left to synchronize and no explicit step was marked."""
    st = _STATE
    if st is None or (implicit and st.handles):
        return
    if st.steps.mark(implicit) and st.tuner is not None and not implicit:
        _autotune.boundary(st)       # autotune counts explicit steps only (same on every rank)


def _finish(st: _State) -> None:
    """Write the trace and the launcher's summary (never raises)."""
    try:
        if st.engine.timeline is not None:
            st.engine.timeline.write()
        write_summary(st.engine.speed, st.rank, st.cfg.host_id)
    except Exception as exc:
        log.warning("cannot write the timeline/summary: %s", exc)


def _handle(handle: int) -> Handle:
    h = _state().handles.get(handle)
    if h is None:
        raise ValueError(f"unknown or already synchronized handle {handle!r}")
    return h


def push_pull(array: np.ndarray, name: str, average: bool = True, priority: int = 0,
              out: np.ndarray | None = None, compression_params: dict | None = None,
              asynchronous: bool = False) -> np.ndarray:
    """push_pull_async + synchronize."""
    return synchronize(push_pull_async(array, name, average, priority, out, compression_params,
                                       asynchronous=asynchronous))


def broadcast_async(array: np.ndarray, root_rank: int, name: str, out: np.ndarray | None = None,
                    priority: int = 0) -> int:
    """Start sending rank ``root_rank``'s ``array`` to every rank under ``name``: the one
    broadcast of byteps, a sum in which every other rank contributes zeros (exact for
    every dtype); returns a handle for :func:`synchronize`.  The checked broadcast of
    every plugin (:func:`byteps.core.collectives.broadcast`) first agrees on the root,
    dtype and shape, then calls this."""
    from byteps.core.rules import check_root
    st = _state()
    root = check_root(root_rank, f"broadcast of {name!r}", st.size)
    array = _contiguous(array)
    src = array if st.rank == root else np.zeros_like(array)
    return push_pull_async(src, name, average=False, priority=priority, out=out)


def broadcast(array: np.ndarray, root_rank: int, name: str | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Return rank ``root_rank``'s ``array`` on every rank (:func:`broadcast_async` under
    ``"broadcast." + name``; without ``name``, :func:`byteps.core.rules.auto_name`)."""
    from byteps.core.rules import auto_name
    name = auto_name("broadcast") if name is None else name
    return synchronize(broadcast_async(array, root_rank, "broadcast." + name, out))


def barrier() -> None:
    """Wait until every worker reaches the barrier."""
    st = _state()
    if st.tuner is not None:
        st.tuner.release()
    if st.engine is not None:
        st.engine.barrier(f"barrier.{next(st.barrier_n)}")


def join(device: int = -1) -> int:
    """This rank ran out of data: Horovod's ``join``.  Until every rank has joined, the
    others' push_pulls complete with zeros from this rank (an average still divides by
    :func:`size`; local reduction: zeros to its host's sums); returns, on every rank, the
    rank that joined last.  Training may go on afterwards (rounds restart together).

    ``device`` is accepted for Horovod compatibility and ignored (CPU summation).
    """
    st = _state()
    if st.engine is None:
        return st.rank
    if st.tuner is not None:
        st.tuner.release()
    for h in list(st.handles.values()):     # this rank's own operations finish first
        while not h.event.wait(0.5):
            if st.engine.fatal:
                st.engine.fail_handle(h, st.engine.fatal)
    for before, _ in list(st.join_hooks):   # background stages stop issuing operations
        before()
    peers = getattr(st, "peers", None)
    if peers is not None:
        peers.announce_join()        # peer algorithms treat this rank as absent (peers.py)
    with _local.joined(st.local):   # local reduction: zeros for the host's sums meanwhile
        last = st.engine.join()
    if peers is not None:
        peers.join_done()
    with st.lock:
        for t in st.tensors.values():
            t.round = 0                       # the servers reset their rounds too
        _redeclare.reset(st)
        if st.tuner is not None:
            st.tuner.saved.clear()            # (also those of keys autotune left behind)
        st.barrier_n = itertools.count()
        st.last_joined = last
    for _, after in list(st.join_hooks):
        after()
    return last


def add_join_hook(before, after) -> None:
    """Run ``before()`` when this rank calls :func:`join` (before it waits for the others)
    and ``after()`` once every rank has joined: a stage with background operations (e.g.
    AsyncModelAverage's thread) stops issuing them meanwhile, so that a joined rank only
    contributes the zeros the servers add for it."""
    _state().join_hooks.append((before, after))


def remove_join_hook(before, after) -> None:
    """Undo :func:`add_join_hook` (no error if it is gone with a re-initialisation)."""
    st = _STATE
    if st is not None and (before, after) in st.join_hooks:
        st.join_hooks.remove((before, after))


def last_joined() -> int | None:
    """The rank that joined last in this process's latest :func:`join` (None: no join
    since :func:`init`); the rank that took the most steps, whose model SyncPS keeps."""
    return _state().last_joined


def _identity(cfg: Config) -> bytes:
    """Routing id at the scheduler: new for every init() (a re-used id would make ZeroMQ's
    ROUTER_HANDOVER rename the old connection and drop its LEAVE), unguessable by strangers."""
    import os
    import secrets
    return f"w/{cfg.host_id}/{cfg.local_rank}/{os.getpid()}/{secrets.token_hex(8)}".encode()




# Horovod's collectives on numpy arrays (every rule decided once, for every plugin)
from byteps.core.collectives import (  # noqa: E402
    allgather, allgather_async, allreduce, allreduce_async, alltoall, alltoall_async,
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_async,
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async)

__all__ += ["allgather", "allgather_async", "allreduce", "allreduce_async", "alltoall",
            "alltoall_async", "grouped_allgather", "grouped_allgather_async",
            "grouped_allreduce", "grouped_allreduce_async", "grouped_reducescatter",
            "grouped_reducescatter_async", "reducescatter", "reducescatter_async",
            "start_timeline", "stop_timeline"]


# telemetry, timeline and compression settings of this worker (byteps/core/api_telemetry.py)
from byteps.core.api_telemetry import (get_pushpull_speed, set_compression_lr,  # noqa: E402
                                       start_timeline, stop_timeline)


# declarations and the per-name rules checked at each use (byteps/core/api_tensors.py)
from byteps.core.api_tensors import (_check_op, _comp_change, _partition,  # noqa: E402,F401
                                     _spec, _tensor, declare)

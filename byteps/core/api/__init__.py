"""The framework-free worker API that every plugin builds on.

Arrays are numpy arrays.  ``push_pull_async`` returns an integer handle;
``synchronize`` waits and returns the result.  Keys come from tensor
*names* (never from declaration order), so ranks may declare in any order.
With one worker and no ``DMLC_*`` variables, everything runs locally
without a network (like the original BytePS).
"""
from __future__ import annotations

import itertools
import logging
import os
import threading

import zmq

from byteps.common import horovod_env
from byteps.common.config import Config
from byteps.common.logs import setup_logging
from byteps.common.node import BytePSError, SchedulerLink
from byteps.common.summary import write_summary
from byteps.common.torchrun import warn_if_torchrun_without_byteps
from byteps.core import autotune as _autotune
from byteps.core.autotune import initial as _autotune_initial
from byteps.core import local as _local
from byteps.core import state as _st
from byteps.core.api import worker_metrics
from byteps.core.engine import Engine
from byteps.core.engine.servers import colocated_config
from byteps.core.timeline import Timeline
from byteps.core.pipeline import redeclare as _redeclare
# the layers below, re-exported: the API every plugin binds (state -> tensors -> push_pull
# -> collectives -> telemetry); none of them imports this module
from byteps.core.state import (BEFORE_SHUTDOWN, NameInFlightError, State,  # noqa: F401
                               Tensor, _contiguous, _State, _state, get_config,
                               is_initialized, local_rank, local_size, rank, size, tensor_key)
from byteps.core.pipeline.tensors import (_check_op, _comp_change, _partition,  # noqa: F401
                                          _spec, _tensor, declare)
from byteps.core.pipeline.pushpull import (  # noqa: F401
    _handle, barrier, broadcast, broadcast_async, poll, push_pull, push_pull_async, step_done,
    synchronize, wait, flush)
from byteps.core.collective.ops import (  # noqa: F401
    allgather, allgather_async, allreduce, allreduce_async, alltoall, alltoall_async,
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_async,
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async)
from byteps.core.api.telemetry import (get_pushpull_speed, set_compression_lr,  # noqa: F401
                                       start_timeline, stop_timeline, take_residual, end_timeline,
                                       resume_timeline)

log = logging.getLogger("byteps.worker")

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "declare", "push_pull_async", "push_pull", "poll", "wait", "flush", "synchronize",
           "broadcast", "broadcast_async", "barrier", "join", "BytePSError", "tensor_key",
           "get_config", "get_pushpull_speed", "set_compression_lr", "allgather", "allgather_async",
           "allreduce", "allreduce_async", "alltoall", "alltoall_async", "grouped_allgather",
           "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_async",
           "grouped_reducescatter", "grouped_reducescatter_async", "reducescatter",
           "reducescatter_async", "start_timeline", "stop_timeline"]

_LAST_LINK: dict | None = None      # the last init()'s scheduler link (exit.py)
_FAILED: list = []                  # an uncaught exception of this process (exit.py)
_INIT_LOCK = threading.Lock()


def __getattr__(name: str):
    """``api._STATE``: the current state (byteps.core.state owns it)."""
    if name == "_STATE":
        return _st.current()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def init(lazy: bool = False) -> None:
    """Join the job described by the environment (see docs/configuration.md)."""
    global _LAST_LINK
    cur = _st.current()
    if cur is not None and getattr(cur.engine, "peer_gone", None):
        from byteps.core.collective.handles import leave   # a membership nothing completes in
        leave(f"another worker left this membership ({cur.engine.peer_gone})")
    with _INIT_LOCK:
        if _st.current() is not None:     # every rank calls it at the same point (Horovod's
            from byteps.core.collective.rules import reset_names    # suites: every test)
            reset_names(at_init=True)     # so unnamed calls one rank skipped realign here
            return
        cfg = Config.from_env()
        setup_logging(cfg, "worker")
        warn_if_torchrun_without_byteps(cfg.distributed, os.environ)
        st = State(cfg)
        st.rank = cfg.local_rank
        if cfg.distributed:
            st.ctx = zmq.Context()
            ident = _identity(cfg)
            st.link = SchedulerLink(cfg, st.ctx, "worker", ident)
            try:
                from byteps.core.algorithms import peers as _peers
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
                if peer_sock is not None:       # worker-to-worker links (algorithms/peers.py)
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
            from byteps.core.api.exit import install_exit_hooks
            install_exit_hooks()
        _st.set_current(st)
        if st.rank == 0:       # once per job: what became of Horovod's variables
            horovod_env.log_notes_once(os.environ, log)
        resume_timeline(st)    # HOROVOD_TIMELINE: Horovod's file, written by rank 0
        if st.engine is not None:
            # BYTEPS_METRICS_PORT, bpslaunch's live view: they read the current state
            worker_metrics.start(cfg, st.rank, _st.current)
            from byteps.core.api import reporter    # heartbeats carry this worker's report
            reporter.attach(st)
            if _autotune_initial.wanted(st):    # every worker of a new job: a short probe
                _autotune_initial.probe(st)


def finish_pending() -> None:
    """The first thing every ``shutdown()`` does (a plugin's before it forgets its own
    handles): the work of this job still in flight (``BEFORE_SHUTDOWN``) is finished."""
    if _st.current() is None:
        return
    for obj in list(_st.BEFORE_SHUTDOWN):
        try:
            obj._bps_before_shutdown()
        except Exception as exc:
            log.warning("shutdown: %s could not finish: %s", type(obj).__name__, exc)


def shutdown() -> None:
    """Leave the job; ``init()`` may be called again afterwards."""
    finish_pending()
    with _INIT_LOCK:
        st = _st.current()
        _st.set_current(None)
    if st is not None:
        end_timeline(st, keep=True)     # HOROVOD_TIMELINE's file: on at the next init()
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


def _finish(st: State) -> None:
    """Write the trace and the launcher's summary (never raises)."""
    try:
        if st.engine.timeline is not None:
            st.engine.timeline.write()
        if st.engine.comp.skips is not None:     # a job that never ended a step
            st.engine.comp.skips.flush()
        write_summary(st.engine.speed, st.rank, st.cfg.host_id, st.engine.comp.totals())
    except Exception as exc:
        log.warning("cannot write the timeline/summary: %s", exc)


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
        for t in list(st.tensors.values()):     # (a background stage may declare one)
            t.round = 0                       # the servers reset their rounds too
        _redeclare.reset(st)
        if st.tuner is not None:
            st.tuner.saved.clear()            # (also those of keys autotune left behind)
        st.barrier_n = itertools.count()
        st.last_joined = last
    from byteps.core.collective.rules import reset_names
    reset_names()             # unnamed calls one rank skipped while another was joined
    _autotune_initial.after_join(st)    # one setting on every rank; tuning ends
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
    st = _st.current()
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


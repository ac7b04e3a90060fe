"""Elastic training on the worker side, framework-free (Horovod elastic's user model).

    @bps.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            ...one step...
            if state.batch % 5 == 0:
                state.commit()          # a copy to go back to; new workers are let in here

    state = bps.elastic.TorchState(model, optimizer, batch=0)     # NumpyState, ObjectState
    train(state)

The scheduler (byteps/scheduler/membership.py) announces membership changes with
``ELASTIC``.  A lost worker makes every pending operation of this epoch fail at once
with :class:`WorkersChanged` (Horovod's ``HorovodInternalError``): :func:`run` restores
the last commit, re-forms the group (:func:`reset`: leave, register again, new epoch,
new dense ranks) and syncs the state from rank 0.  A worker that asks to join is let in
at the next ``state.commit()``: every member agrees on it there (a sum over the members)
and raises :class:`HostsUpdatedInterrupt` at the same step; nothing is restored.
"""
from __future__ import annotations

import functools
import logging

import numpy as np

from byteps.common.node import BytePSError
from byteps.transport.wire import WireError, elastic_body

log = logging.getLogger("byteps.worker")

__all__ = ["run", "reset", "WorkersChanged", "HostsUpdatedInterrupt", "check_host_updates",
           "membership_changed", "suspend", "resume"]


class WorkersChanged(BytePSError):
    """A worker of this epoch was lost: this epoch's pending operations cannot complete
    (Horovod's ``HorovodInternalError``).  :func:`run` restores the last commit and goes on."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``state.commit()`` on every rank at the same step when workers ask to join
    (Horovod's name).  ``skip_sync``: no state needs to be broadcast afterwards."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's workers changed: re-forming the group at this commit")
        self.skip_sync = skip_sync


# ---------------------------------------------------------------------- engine side
def on_message(engine, body) -> None:
    """``ELASTIC`` from the scheduler (engine thread): note the change; a lost worker
    fails every pending operation and every later one until :func:`reset`."""
    try:
        gen, removed, reason = elastic_body(body)
    except WireError as exc:
        return engine.drops.warn("bad ELASTIC message", str(exc))
    engine.elastic_gen = max(getattr(engine, "elastic_gen", 0), gen)
    log.info("worker rank %d: membership change %d: %s", engine.rank, gen, reason)
    if removed and not getattr(engine, "elastic_resetting", False):
        interrupt(engine, WorkersChanged(
            f"worker rank {engine.rank}: the job's membership changed ({reason}); the "
            f"operations of this epoch cannot complete: with bps.elastic.run the last commit "
            f"is restored and training goes on in a re-formed group"))


def interrupt(engine, err: WorkersChanged) -> None:
    """Fail every queued and in-flight operation, barrier and join() with ``err``, and every
    later submission, without ending the process (unlike a job failure)."""
    with engine.lock:
        engine.fatal = err
        tasks = list(engine.inflight.values()) + engine.heap + list(engine.pending)
        engine.pending.clear()
    engine.heap.clear()
    engine.inflight.clear()
    engine.inflight_bytes = 0
    for t in tasks:
        engine.fail_handle(t.handle, err)
    for ev in list(engine.barriers.values()):
        ev.set()
    if engine.join_event is not None:
        engine.join_event.set()


def allow_stop(engine) -> None:
    """A lost worker's interrupt must not keep this worker from leaving or exiting cleanly
    (``shutdown()``, the end of the process, :func:`reset`): clear it."""
    engine.elastic_resetting = True         # later ELASTIC messages only update the count
    with engine.lock:
        if isinstance(engine.fatal, WorkersChanged):
            engine.fatal = None


# ---------------------------------------------------------------------- user side
def _state():
    from byteps.core import state
    return state.current()


def membership_changed() -> bool:
    """True when a lost worker interrupted this epoch (the next call to :func:`reset`
    re-forms the group)."""
    st = _state()
    return st is not None and st.engine is not None and isinstance(st.engine.fatal,
                                                                    WorkersChanged)


def _formed_gen(st) -> int:
    gen = st.book.get("elastic_gen", 0)
    if type(gen) is not int or not 0 <= gen < 1 << 31:
        raise BytePSError(f"worker rank {st.rank}: malformed elastic_gen {gen!r} in the "
                          f"address book")
    return gen


def check_host_updates(name: str = "elastic.host_updates") -> None:
    """Raise :class:`HostsUpdatedInterrupt` on every rank at once when a worker asked to
    join: whether any member heard of a change after the one this group was formed at (a
    sum over the members).  A collective: every rank calls it at the same
    step (``state.commit()`` does)."""
    from byteps.core import api
    st = api._state()
    if st.engine is None:
        return
    formed = _formed_gen(st)
    heard = int(getattr(st.engine, "elastic_gen", 0) > formed)
    # a sum, not a max: also available in asynchronous mode (BYTEPS_ENABLE_ASYNC=1)
    agreed = api.push_pull(np.array([heard], np.int64), name, average=False)
    if int(agreed[0]) > 0:
        log.info("worker rank %d: %d of %d worker(s) heard of workers asking to join: "
                 "re-forming at this commit", st.rank, int(agreed[0]), st.size)
        raise HostsUpdatedInterrupt(skip_sync=False)


def reset() -> None:
    """Leave the current group and register again: returns in the re-formed group (new
    epoch, new rank and size; every tensor's rounds start again)."""
    from byteps.core import api
    st = _state()
    if st is not None and st.engine is not None:
        allow_stop(st.engine)               # lets the engine stop (and send LEAVE) cleanly
        old = st.rank
    else:
        old = None
    declared = dict(st.declared) if st is not None else {}
    api.shutdown()
    api.init()
    # declare()d compression settings outlive the group (the servers keep the declarations)
    api._state().declared.update(declared)
    log.info("elastic: worker rank %s is rank %d of %d in the re-formed group", old,
             api.rank(), api.size())


def run(func):
    """Decorator: run ``func(state, ...)`` and keep it running across membership changes
    (Horovod's ``hvd.elastic.run``).

    Before the first call and after every change the state is synced from rank 0.  A lost
    worker (:class:`WorkersChanged`, or any error raised once a lost worker interrupted
    the epoch) restores the last commit; workers asking to join
    (:class:`HostsUpdatedInterrupt`) keep the state as it is.  Then the group re-forms
    (:func:`reset`) and the reset callbacks run (``state.register_reset_callbacks``).
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            except Exception as exc:        # a framework may wrap the BytePSError
                if not (isinstance(exc, WorkersChanged) or membership_changed()):
                    raise
                log.warning("%s", exc)
                state.restore()
                skip_sync = False
            reset()
            state.on_reset()
    return wrapper


# ---------------------------------------------------------------------- the original's API
def suspend(shutdown=None) -> None:
    """The original BytePS's ``suspend()``: leave the job (as ``shutdown()``; a plugin
    passes its own) until :func:`resume`.  Meanwhile ``rank()``, ``size()``,
    ``local_rank()`` and ``local_size()`` answer what they did before, as the original's
    do (its elastic example logs with them there); ``is_initialized()`` is False."""
    from byteps.core import state
    from byteps.core.api import basics
    kept = state.ids()
    (shutdown or basics.shutdown)()
    state.keep_ids_while_suspended(kept)


def resume(num_workers: int | None = None, num_servers: int | None = None,
           global_rank: int = -1, context=None) -> None:
    """The original BytePS's ``resume(num_workers, num_servers, global_rank, context)``:
    register again.  The group re-forms (a new epoch) once every worker of the job has
    resumed, or, in an elastic job (``--min-workers``), once every live member has; who
    registers decides the membership, so ``num_workers`` is only checked against
    ``DMLC_NUM_WORKER`` outside elastic jobs.  The servers cannot change
    (``num_servers`` must equal ``DMLC_NUM_SERVER``); ranks are assigned by the scheduler
    (``global_rank`` is ignored) and keys come from names (``context`` is not needed)."""
    import os
    import warnings
    from byteps.core import api
    env = os.environ
    if num_servers is not None and env.get("DMLC_NUM_SERVER") not in (None, str(num_servers)):
        raise BytePSError(f"resume(num_servers={num_servers}): this job has "
                          f"DMLC_NUM_SERVER={env['DMLC_NUM_SERVER']} servers and they cannot "
                          f"change; pass the same number (workers may change in an elastic "
                          f"job, bpslaunch --min-workers)")
    if num_workers is not None and not env.get("BYTEPS_MIN_WORKERS"):
        hosts, local = int(env.get("DMLC_NUM_WORKER", "1")), int(env.get("BYTEPS_LOCAL_SIZE",
                                                                            "1"))
        if num_workers != hosts * local:
            raise BytePSError(f"resume(num_workers={num_workers}): the job has "
                              f"{hosts * local} worker(s) (DMLC_NUM_WORKER={hosts} x "
                              f"BYTEPS_LOCAL_SIZE={local}); changing the number of workers "
                              f"needs an elastic job (bpslaunch --min-workers)")
    if global_rank is not None and global_rank >= 0:
        warnings.warn("resume(global_rank=...) is ignored: the scheduler assigns dense ranks",
                      stacklevel=2)
    api.init()

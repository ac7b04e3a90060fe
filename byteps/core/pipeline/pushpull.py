"""push_pull and the operations built directly on it: the worker's one path for a
tensor (declare -> redeclare -> partitions -> local reduction or the engine -> result),
its handles (poll, synchronize), broadcast and barrier.  Reads the process state
(:mod:`byteps.core.state`); the collectives and the algorithms build on this module."""
from __future__ import annotations

import time

import numpy as np

from byteps.common.errors import BytePSError, again
from byteps.core import autotune as _autotune
from byteps.core import hvd_timeline as _hvd_timeline
from byteps.core.autotune import initial as _initial
from byteps.core.collective import handles as _coll
from byteps.core.pipeline import redeclare as _redeclare
from byteps.core.engine import Handle, Task, comp_pipeline
from byteps.core.engine import deadlock as _deadlock
from byteps.core.state import NameInFlightError, _contiguous, _state, rank, size  # noqa: F401
from byteps.core import state as _st
from byteps.core.pipeline.tensors import _check_op, _tensor
from byteps.transport.wire import ASYNC


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
    :func:`byteps.core.collective.ops.resolve_op`).

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
    rec = None if st.hvd_timeline is None else st.hvd_timeline.begin(name, time.monotonic())
    if not asynchronous:                # a name used again with another layout: its own key
        name = _redeclare.current(st, name, src, op)
    new = name not in st.tensors
    t = _tensor(st, name, src, compression_params, op)
    if new and asynchronous:
        t.wire_flags = ASYNC
    if bool(t.wire_flags & ASYNC) != bool(asynchronous):
        from byteps.core.algorithms.async_ps import mode_change
        raise BytePSError(mode_change(st, name, asynchronous))
    st.steps.pushed(name)
    if st.tuner is not None:
        _initial.infer_boundary(st, name, asynchronous)    # a repeated name ends a step
        _autotune.relayout(st, t, src.nbytes)
    hid = next(st.ids)
    st.steps.track(hid, st.handles)       # the loop's own push_pulls (timeline.StepCounter)
    if st.engine is None or (src.size == 0 and not asynchronous):   # nothing to exchange
        h = Handle(hid, t, out, 0, average)
        h.hvd = rec
        if asynchronous:        # one process: the "servers' value" is kept here
            from byteps.core.algorithms.async_ps import local_add
            src = local_add(st, name, src)
        if out is not src:
            np.copyto(out, src)
        h.done()
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
            st.handles[hid] = h = st.local.submit(hid, t, src, out, average, priority,
                                                  raw=uncompressed)
        except BaseException:
            t.busy = None
            raise
        if rec is not None:             # it may have completed already: written once
            h.hvd = rec
            if h.event.is_set():
                rec.finish(h)
        _redeclare.check(st, t, hid, push_pull_async)   # ranks agree on a re-used name
        return hid
    h = Handle(hid, t, out, len(t.parts), average)
    h.hvd = rec
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


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished."""
    if handle in _st.OPS:
        return _st.OPS[handle].event.is_set()
    h = _handle(handle)
    st = _st.current()
    if st is not None and st.tuner is not None:
        st.tuner.release()        # partitions autotune held go out at the first wait
    return h.event.is_set()


def wait(handle: int, timeout: float) -> bool:
    """Whether ``handle``'s operation finished, waiting up to ``timeout`` seconds: for a
    thread that watches several handles (the one it needs first).  Unlike :func:`poll`
    and :func:`synchronize` it is not the step's first wait: partitions autotune holds
    stay held until then, or until :func:`flush`."""
    if handle in _st.OPS:
        return _st.OPS[handle].event.wait(timeout)
    return _handle(handle).event.wait(timeout)


def flush() -> None:
    """The step's gradients are all pushed: what autotune held goes out now (a plugin
    whose step does not wait for them, such as torch's CrossBarrier, calls it)."""
    st = _st.current()
    if st is not None and st.tuner is not None:
        st.tuner.release()


def synchronize(handle: int) -> np.ndarray:
    """Wait for ``handle`` and return the result (raises BytePSError on failure).

    Handles of the collectives in :mod:`byteps.core.collective.ops` return their result
    (an array, a list of arrays, or ``(array, received_splits)`` for alltoall)."""
    if handle in _st.OPS:
        busy = _coll.busy_label(handle)
        with _deadlock.waiting(("handle", handle), busy):   # the scheduler's deadlock detection
            return _coll.wait(handle)
    st = _state()
    h = _handle(handle)
    if st.tuner is not None:
        st.tuner.release()            # partitions autotune held go out at the first wait
    t0 = time.monotonic()
    st.steps.waiting = (getattr(h.tensor, "name", ""), t0)     # the hang doctor's "owes"
    end = _coll.deadline(st)          # BYTEPS_COLLECTIVE_TIMEOUT_S
    try:
        with _deadlock.waiting(("handle", handle),      # the scheduler's deadlock detection
                               f"push_pull {getattr(h.tensor, 'name', '')!r}"):
            _wait(st, h, end)
    except BaseException as exc:      # interrupted: this rank leaves (collective/handles)
        _coll.interrupted(exc, f"push_pull of {getattr(h.tensor, 'name', '')!r}", st)
        if isinstance(exc, _coll.CollectiveBehindError):   # it stays: this wait is over
            st.handles.pop(handle, None)
            _coll.release(handle)
        raise
    st.steps.waited(getattr(h.tensor, "name", ""), time.monotonic() - t0)   # compute/wait split (reporter)
    st.handles.pop(handle, None)
    _coll.release(handle)         # a name reserved by collectives.allreduce_async
    if h.error is not None:
        raise again(h.error)          # its message and flags (one block per cause)
    return h.out


def _wait(st, h, end) -> None:
    """Block until handle ``h`` is done, failed, or ended (its membership, its deadline)."""
    while not h.event.wait(0.5):
        if st.engine is not None and st.engine.fatal:
            st.engine.fail_handle(h, st.engine.fatal)
        elif st.engine is not None and _st.current() is not st:   # shutdown() ended it
            st.engine.fail_handle(h, BytePSError(
                f"push_pull of {getattr(h.tensor, 'name', '')!r}: shutdown() ended the "
                f"membership it was started in"))
        elif not h.event.is_set():
            _coll.check_deadline(end, f"push_pull of {getattr(h.tensor, 'name', '')!r}", st)
    if h.error is not None and st.engine is not None and getattr(st.engine, "deadlock", None):
        # a deadlocked rank that left first fails this one's round: the deadlock is the cause
        _coll.check_deadline(None, f"push_pull of {getattr(h.tensor, 'name', '')!r}", st)


def step_done(implicit: bool = False, in_set: bool = False) -> None:
    """This worker's current training step ended (plugins call it from their optimizer's
    step; numpy users may too).  The timeline's trace window counts these steps; see
    :class:`byteps.core.timeline.StepCounter`.  ``implicit`` (numpy ``synchronize``)
    counts only when none of the loop's own push_pulls is left to synchronize (another
    thread's may be: ``StepCounter.busy``) and no explicit step was marked.  ``in_set``:
    the step of an optimizer over a process set other than the global one (members and
    the ranks outside it alike), which the timeline counts but autotune does not: its
    exchanges at a step end are the whole job's, and only the set's ranks take such
    steps, or each set its own number of them (its gradients go over the set's
    worker-to-worker links, which autotune does not tune anyway)."""
    st = _st.current()
    if st is None or (implicit and st.steps.busy(st.handles)):
        return
    if st.steps.mark(implicit) and st.tuner is not None and not implicit and not in_set:
        _autotune.boundary(st)       # autotune counts explicit steps only (same on every rank)


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
    every plugin (:func:`byteps.core.collective.ops.broadcast`) first agrees on the root,
    dtype and shape, then calls this."""
    from byteps.core.collective.rules import check_root
    st = _state()
    root = check_root(root_rank, f"broadcast of {name!r}", st.size)
    array = _contiguous(array)
    src = array if st.rank == root else np.zeros_like(array)
    with _hvd_timeline.collective("broadcast", name, inner=True):   # its timeline row
        return push_pull_async(src, name, average=False, priority=priority, out=out)


def broadcast(array: np.ndarray, root_rank: int, name: str | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Return rank ``root_rank``'s ``array`` on every rank (:func:`broadcast_async` under
    ``"broadcast." + name``; without ``name``, :func:`byteps.core.collective.rules.auto_name`)."""
    from byteps.core.collective.rules import auto_name
    name = auto_name("broadcast") if name is None else name
    return synchronize(broadcast_async(array, root_rank, "broadcast." + name, out))


def barrier() -> None:
    """Wait until every worker reaches the barrier."""
    st = _state()
    if st.tuner is not None:
        st.tuner.release()
    if st.engine is not None:
        end = _coll.deadline(st)      # BYTEPS_COLLECTIVE_TIMEOUT_S
        name = f"barrier.{next(st.barrier_n)}"
        try:
            with _deadlock.waiting(("barrier", name), f"barrier {name!r}"):   # deadlock detection
                st.engine.barrier(name, lambda: _coll.check_deadline(end, "a barrier", st))
        except _coll.CollectiveTimeoutError as exc:
            _coll.interrupted(exc, "a barrier", st)
            raise
        except BytePSError:
            raise
        except BaseException as exc:  # interrupted: this rank leaves (collective/handles)
            _coll.interrupted(exc, "a barrier", st)
            raise

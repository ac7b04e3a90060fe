"""Handles of the collectives in :mod:`byteps.core.collective.ops` and the names they hold.

An operation of more than one exchange runs on a thread of its own (:func:`start`), so
ranks may synchronize their handles in any order; :func:`wait` returns its result.  A
name is held for one kind of operation from its start until its handle is synchronized
(Horovod's duplicate-name rule, raised as a ValueError in the caller's thread, so every
rank raises at the same call).
"""
from __future__ import annotations

import contextvars
import logging
import threading
import time

from byteps.common.errors import BytePSError
from byteps.core import hvd_timeline as _hvd_timeline
from byteps.core import state as _st

log = logging.getLogger("byteps.worker")


class _Op:
    __slots__ = ("id", "event", "error", "result")

    def __init__(self, hid: int):
        self.id, self.event, self.error, self.result = hid, threading.Event(), None, None


OPS: dict[int, _Op] = _st.OPS   # handle -> collective in flight (synchronize looks here)
_BUSY: dict[tuple, int] = {}    # (kind, name) -> handle, until that handle is synchronized
_BUSY_BY_HANDLE: dict[int, tuple] = {}
_busy_lock = threading.Lock()


def _claim(kind: str, name: str) -> tuple:
    """Reserve ``name`` for one ``kind`` of operation until its handle is synchronized:
    Horovod's duplicate-name rule, raised in the caller's thread (so every rank raises at
    the same call) as a ValueError."""
    key = (kind, name)
    with _busy_lock:
        if key in _BUSY:
            raise _st.NameInFlightError(
                f"{kind} {name!r} is already in flight on rank {_st.rank()} (handle "
                f"{_BUSY[key]}); synchronize() it before using the name again, or use a "
                f"distinct name")
        _BUSY[key] = 0
    return key


def _bind(key: tuple, handle: int) -> int:
    with _busy_lock:
        _BUSY[key] = handle
        _BUSY_BY_HANDLE[handle] = key
    return handle


def _unclaim(key: tuple) -> None:
    with _busy_lock:
        if _BUSY.get(key) == 0:
            del _BUSY[key]


def busy_label(handle: int) -> str | None:
    """``handle``'s operation as the deadlock reports spell it (``allreduce 'x'``), or None."""
    with _busy_lock:
        key = _BUSY_BY_HANDLE.get(handle)
    return None if key is None else f"{key[0]} {key[1]!r}"


def release(handle: int) -> None:
    """Free the name reserved by ``handle`` (api.synchronize calls this)."""
    with _busy_lock:
        key = _BUSY_BY_HANDLE.pop(handle, None)
        if key is not None and _BUSY.get(key) == handle:
            del _BUSY[key]


def reset() -> None:
    """Forget reserved names and unfinished handles (shutdown)."""
    with _busy_lock:
        _BUSY.clear()
        _BUSY_BY_HANDLE.clear()
    OPS.clear()


def reserved(kind: str, name: str, begin) -> int:
    """``begin()`` (returns a handle) with ``name`` reserved for ``kind`` until the handle
    is synchronized."""
    key = _claim(kind, name)
    try:
        with _hvd_timeline.collective(kind, name):   # its push_pulls' row in the timeline
            return _bind(key, begin())
    except BaseException:
        _unclaim(key)
        raise


def start(kind: str, fn) -> int:
    """Run ``fn`` (blocking exchanges) on a thread of its own; returns its handle."""
    st = _st._state()
    op = _Op(next(st.ids))

    def run():
        try:
            op.result = fn()
        except BaseException as exc:      # re-raised by wait() in the caller's thread
            op.error = exc
        finally:
            op.event.set()
    OPS[op.id] = op
    if st.engine is None:                 # a local job: nothing to wait for
        run()
    else:                                 # in the caller's context (hvd_timeline.collective)
        threading.Thread(target=contextvars.copy_context().run, args=(run,),
                         name=f"bps-{kind}-{op.id}", daemon=True).start()
    return op.id


def leave(why: str) -> None:
    """Leave the current membership (shutdown: process sets, handles and unnamed-call
    counters forgotten) because nothing global can complete in it any more; the next
    ``init()`` forms the group anew with the other ranks.  Work still waiting on this
    rank's old engine fails instead of waiting forever."""
    st = _st.current()
    if st is None or st.engine is None:
        return
    log.warning("worker rank %d leaves the job's current membership: %s; the next init() "
                "joins the group again", st.rank, why)
    from byteps.core.api import basics
    from byteps.core.collective import process_sets
    process_sets.depart(f"left the job's membership: {why}")   # the set members first
    try:
        basics.shutdown()
    finally:
        if st.engine.fatal is None:
            st.engine.fatal = BytePSError(f"worker rank {st.rank} left the membership: {why}")


class CollectiveTimeoutError(BytePSError, TimeoutError):
    """A wait passed ``BYTEPS_COLLECTIVE_TIMEOUT_S``: a ``BytePSError`` and a
    ``TimeoutError``."""


def deadline(st) -> float | None:
    """When a wait that starts now passes ``BYTEPS_COLLECTIVE_TIMEOUT_S`` (None: unset,
    wait as long as it takes, as Horovod)."""
    limit = getattr(getattr(st, "cfg", None), "collective_timeout_s", None)
    return time.monotonic() + limit if limit else None


class CollectiveDeadlockError(CollectiveTimeoutError):
    """Every worker waits in a collective that another rank never started (the scheduler's
    deadlock detection, byteps/core/engine/deadlock.py): a ``CollectiveTimeoutError``."""


class CollectiveBehindError(CollectiveTimeoutError):
    """This rank waits in a collective of an earlier generation than the other ranks'
    (byteps/common/generation.py): they called init() (or join()) again without making it,
    so it never completes
    (the scheduler's "behind" rule, byteps/scheduler/deadlock.py).  Only this rank's waits
    of that generation fail, and it stays in the job: a ``CollectiveTimeoutError``."""


def check_deadline(end: float | None, what: str, st) -> None:
    """Raise :class:`CollectiveTimeoutError` when ``end`` (:func:`deadline`) has passed, or
    :class:`CollectiveDeadlockError` when the scheduler found the ranks deadlocked; the
    caller's wait then treats it as an interruption (:func:`interrupted`: this rank leaves,
    so the other ranks fail naming it instead of waiting on)."""
    behind = getattr(getattr(st, "engine", None), "behind", None)
    if behind and _st.current() is st:
        from byteps.core.collective.rules import generation
        if generation() < behind[0]:
            raise CollectiveBehindError(
                f"worker rank {st.rank}: {what}: {behind[1]}; this rank stays in the job: "
                f"its next init() (or join()) is where the other ranks are")
    why = getattr(getattr(st, "engine", None), "deadlock", None)
    if why and _st.current() is st:
        raise CollectiveDeadlockError(
            f"worker rank {st.rank}: {what}: {why}; this rank leaves the job's current "
            f"membership; catch the error and call shutdown() and init() on every rank to go "
            f"on (every rank gets this error)")
    if end is None or time.monotonic() < end or _st.current() is not st:
        return                # (a wait of an ended membership: its own check fails it)
    raise CollectiveTimeoutError(
        f"worker rank {st.rank}: {what} waited {st.cfg.collective_timeout_s:g} s "
        f"(BYTEPS_COLLECTIVE_TIMEOUT_S) for the other ranks: one of them is late, failed "
        f"before this call, or called another collective or name here; this rank leaves the "
        f"job's current membership, so the others fail naming it; catch the error and call "
        f"shutdown() and init() on every rank to go on (or raise "
        f"BYTEPS_COLLECTIVE_TIMEOUT_S if ranks may legitimately be this late)")


def interrupted(exc: BaseException, what: str, st=None) -> None:
    """A wait for ``what`` was interrupted by ``exc`` (raised inside the wait: a test's
    timeout, a signal handler's exception): the other ranks would wait for this rank's
    part forever, so this rank leaves the membership at once (they fail naming it, and
    every rank's next init() forms the group again).  Ctrl-C and sys.exit keep their own
    path (the launcher ends the job).  ``st``: the state the wait belongs to; a wait left
    over from a membership that shutdown() ended never touches the current one."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, CollectiveBehindError)):
        return
    if st is not None and _st.current() is not st:
        return
    try:
        leave(f"its wait for {what} was interrupted by {type(exc).__name__}: {exc}"[:500])
    except Exception as err:          # the interruption is what the caller must see
        log.warning("leaving the membership failed: %s", err)


def wait(handle: int):
    """Wait for a collective's handle and return its result (or raise its error)."""
    op = OPS[handle]
    try:
        op.event.wait()
    except BaseException as exc:
        interrupted(exc, f"collective handle {handle}")
        raise
    OPS.pop(handle, None)
    release(handle)
    if op.error is not None:
        raise op.error
    return op.result


"""The worker API's telemetry, timeline and compression-settings calls (re-exported by
:mod:`byteps.core.api`): push_pull speed and per-tensor byte counts, Horovod's
start_timeline/stop_timeline, and the learning rate for lr-aware error feedback.
"""
from __future__ import annotations

import atexit
import os
import time

from byteps.core import state as _api
from byteps.core.hvd_timeline import HorovodTimeline


def set_compression_lr(lr: float) -> None:
    """Tell error feedback the learning rate of the coming step (the original's lr-aware
    error feedback scales the residual by previous lr / current lr)."""
    st = _api._state()
    from byteps.core import engine
    engine.COMP_LR[0] = lr
    for t in list(st.tensors.values()):
        for p in list(t.pipes.values()):
            p.set_lr(lr)
    if st.local is not None:
        for sl in list(st.local.slice_cache.values()):
            for t in sl:
                for p in list(t.pipes.values()):
                    p.set_lr(lr)


def take_residual(name: str, out) -> bool:
    """Move the error-feedback residual this rank holds for tensor ``name`` (what
    compression left unsent, per element) into ``out`` (float32 or wider, the tensor's
    size): ``out += r``, then ``r = 0``, so the next push of ``name`` sends only what it is
    given.  Under local reduction the residual is of the host's sum, held by the ranks
    that push for the host (root mode: local rank 0; slice mode: each its own slice), and
    they take all of it.  For an algorithm that keeps in its model what compression did
    not carry (AsyncModelAverage).  Call it with no push_pull of ``name`` in flight.
    Returns whether this rank held any residual of it."""
    st = _api._state()
    t = st.tensors.get(name)
    if t is None:
        return False
    if not out.flags.c_contiguous:      # reshape would copy, and the residual be lost
        raise ValueError(f"take_residual({name!r}): out must be C-contiguous")
    held = t.held() if st.local is None else st.local.cuts.held(name)
    flat = out.reshape(-1)
    got = False
    for start, p in held:
        if p.residual is not None:
            flat[start:start + p.n] += p.residual
            p.residual.fill(0.0)
            got = True
    return got


def get_pushpull_speed(per_tensor: bool = False):
    """Recent push-pull speed of this worker: ``(ms since epoch, MB/s)``.

    Like the original BytePS: bytes of the partitions completed in the last
    10 seconds (each is pushed and pulled once) per second, 1 MB = 1e6 bytes,
    counted before compression.  A local (non-distributed) job reports 0.0.

    ``per_tensor=True`` returns ``(ms, MB/s, {name: bytes})`` instead, where
    ``bytes`` holds the totals ``pushed``/``pulled`` before compression and
    ``pushed_wire``/``pulled_wire`` as sent and received (this rank's network
    traffic; with local reduction only the ranks that talk to servers count).
    """
    st = _api._state()
    ms, mbs = (int(time.time() * 1000), 0.0) if st.engine is None else st.engine.speed.get()
    if not per_tensor:
        return ms, mbs
    table = {} if st.engine is None else {
        name: {"pushed": b[0], "pushed_wire": b[1], "pulled": b[2], "pulled_wire": b[3]}
        for name, b in list(st.engine.bytes.items())}
    return ms, mbs, table


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: from now on rank 0 writes Horovod's timeline into
    ``file_path`` as operations finish (byteps/core/hvd_timeline.py; the other ranks record
    nothing, as in Horovod).  ``mark_cycles``: ``CYCLE_START`` markers.  Called again with
    the same path it goes on (``mark_cycles`` as given); with another, the first file is
    closed and the new one begun."""
    st = _api._state()
    if not isinstance(file_path, str) or not file_path:
        raise ValueError(f"start_timeline needs a file path, got {file_path!r}")
    if st.rank != 0:
        return
    path = os.path.abspath(file_path)
    cur = st.hvd_timeline
    if cur is not None and cur.path == path:
        cur.mark_cycles = bool(mark_cycles)
        return
    end_timeline(st)
    st.hvd_timeline = HorovodTimeline(path, st.rank, mark_cycles)
    if st.engine is not None:
        st.engine.hvd_timeline = st.hvd_timeline


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` (or ``HOROVOD_TIMELINE``): what
    finished until now is in its file, which is closed."""
    end_timeline(_api._state())


_KEPT: list = []     # HOROVOD_TIMELINE's file between shutdown() and the next init()


@atexit.register
def _close_kept() -> None:
    """The end of the process: what the kept timeline has queued is written."""
    while _KEPT:
        _KEPT.pop().stop()


def end_timeline(st, keep: bool = False) -> None:
    """Close ``st``'s Horovod timeline, if any (stop_timeline, shutdown).  ``keep``
    (shutdown): one that ``HOROVOD_TIMELINE`` began stays open for the next ``init()``
    of this process (an elastic re-form), which goes on writing it."""
    tl, st.hvd_timeline = st.hvd_timeline, None
    if st.engine is not None:
        st.engine.hvd_timeline = None
    if tl is not None and keep and tl.from_env:
        _KEPT[:] = [tl]
    elif tl is not None:
        tl.stop()


def resume_timeline(st) -> None:
    """At ``init()``: rank 0 writes ``HOROVOD_TIMELINE``'s file (``st.cfg.timeline``), going
    on with the one the last shutdown() kept when it is the same file; any other kept one
    is closed."""
    kept = _KEPT.pop() if _KEPT else None
    path = os.path.abspath(st.cfg.timeline) if st.cfg.timeline and st.rank == 0 else None
    if kept is not None and kept.path == path:
        kept.mark_cycles = bool(st.cfg.timeline_mark_cycles)
        st.hvd_timeline = kept
        if st.engine is not None:
            st.engine.hvd_timeline = kept
        return
    if kept is not None:
        kept.stop()
    if path is not None:
        start_timeline(path, st.cfg.timeline_mark_cycles)
        st.hvd_timeline.from_env = True

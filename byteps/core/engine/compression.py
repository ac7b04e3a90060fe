"""The worker engine's compression stage: per-partition pipelines, compress-on-send and
decompress-on-pull with timeline spans, and per-tensor byte counts before and after
compression.

:class:`Compression` is held by :class:`byteps.core.engine.Engine` (``engine.comp``); it
runs on the engine thread.  The compressors themselves are in :mod:`byteps.compression`.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from byteps.common.errors import BytePSError
from byteps.transport.wire import ASYNC, COMP, NONFINITE, Entry, frame_bytes

COMP_LR: list = [None]    # the learning rate last given to api.set_compression_lr()
log = logging.getLogger("byteps.worker")
_SKIP_SHOWN = 12          # tensors named in the skip notice (then "and N more")


class SkipNotice:
    """Tensors that asked for compression but travel uncompressed (smaller than
    ``BYTEPS_MIN_COMPRESS_BYTES``, or not floating-point).  Rank 0 logs them in one line,
    once per process: at the end of the first step (every tensor of a step is declared by
    then), or at shutdown for a job that never ended a step."""

    def __init__(self, min_bytes: int, one_host: bool = False, alone: bool = False):
        self.min_bytes = min_bytes
        self.one_host = one_host     # local reduction, one host: nothing crosses a network
        self.alone = alone           # a job of one worker: nothing is exchanged at all
        self.asked = 0
        self.small: list[tuple[str, int]] = []
        self.other: list[tuple[str, str]] = []
        self.shown = False

    def note(self, name: str, arr, compressed: bool) -> None:
        if self.shown:
            return
        self.asked += 1
        if compressed:
            return
        if arr.dtype.kind != "f":
            self.other.append((name, str(arr.dtype)))
        else:
            self.small.append((name, int(arr.nbytes)))

    def line(self) -> str | None:
        """The notice, or None when every tensor asked to be compressed is."""
        if self.alone and self.asked:
            return (f"compression: nothing is compressed: this job has one worker, which "
                    f"exchanges nothing ({self.asked} tensor(s) asked for compression)")
        if self.one_host and self.asked:
            return (f"compression: nothing is compressed: every worker of this job is on one "
                    f"host and local reduction sums in shared memory, so no tensor crosses "
                    f"the network ({self.asked} tensor(s) asked for compression); "
                    f"BYTEPS_LOCAL_REDUCE=0 sends them through the servers, compressed")
        n = len(self.small) + len(self.other)
        if not n:
            return None
        parts = []
        if self.small:
            names = ", ".join(f"{k!r} ({b} B)" for k, b in self.small[:_SKIP_SHOWN])
            more = len(self.small) - _SKIP_SHOWN
            parts.append(f"{names}{f' and {more} more' if more > 0 else ''} smaller than "
                         f"BYTEPS_MIN_COMPRESS_BYTES={self.min_bytes} (set it lower to "
                         f"compress them; compressing small tensors rarely pays)")
        if self.other:
            names = ", ".join(f"{k!r} ({d})" for k, d in self.other[:_SKIP_SHOWN])
            more = len(self.other) - _SKIP_SHOWN
            parts.append(f"{names}{f' and {more} more' if more > 0 else ''} not "
                         f"floating-point (only float tensors are compressed)")
        return f"compression: {n} tensor(s) travel uncompressed: " + "; ".join(parts)

    def flush(self, _step: int = 0) -> None:
        """Log the notice (once)."""
        if self.shown:
            return
        self.shown = True
        text = self.line()
        if text:
            log.warning("%s", text)


def note_compression(st, tensor, arr) -> None:
    """``tensor`` asked for compression (``tensor.spec`` None: it travels uncompressed):
    remembered for rank 0's notice (:class:`SkipNotice`, ``engine.comp.skips``), logged when
    the first step ends."""
    if st.rank != 0:
        return                      # rank 0 speaks for the job
    holder = st.engine.comp if st.engine is not None else st   # (a job of one worker)
    notice = getattr(holder, "skips", None)
    if notice is None:
        one_host = st.local is not None and not getattr(st.local, "network", True)
        notice = holder.skips = SkipNotice(st.cfg.min_compress_bytes, one_host,
                                           alone=st.engine is None)
        st.steps.listeners.append(notice.flush)
    notice.note(tensor.name, arr, tensor.spec is not None)


def comp_pipeline(tensor, part: int, length: int):
    """The worker-side compression pipeline of partition ``part`` of ``tensor`` (None when
    the tensor travels uncompressed).  One per partition: it owns the partition's error
    feedback residual and momentum buffer."""
    spec = getattr(tensor, "spec", None)
    if spec is None:
        return None
    p = tensor.pipes.get(part)
    if p is None:
        from byteps import compression
        p = tensor.pipes[part] = compression.worker_pipeline(spec, length, tensor.key, part)
        if COMP_LR[0] is not None:
            p.set_lr(COMP_LR[0])
    return p


def recut_pipelines(tensor, old_parts: list) -> None:
    """``tensor`` (none of it in flight) was cut anew into ``tensor.parts`` under a new key
    (autotune): fresh pipelines for the new partitions (their key is the new one, as on
    the servers), with the old pipelines' error-feedback residual and momentum carried
    per element (:func:`byteps.compression.carry_state`).  ``old_parts``: the old cut."""
    if getattr(tensor, "spec", None) is None:
        return
    from byteps.compression import carry_state
    old = tensor.held(old_parts)
    tensor.pipes = {}
    new = [(start, comp_pipeline(tensor, part, length))
           for part, start, length, _ in tensor.parts]
    carry_state(old, new, sum(length for _, _, length, _ in tensor.parts))


def comp_flags(tensor, wire=None) -> int:
    """Entry flags of a compressed push (or resent pull) of ``tensor``: COMP, plus ASYNC
    for an asynchronous key (AsyncPS's compressed parameter deltas), plus NONFINITE for a
    push whose frame (``wire``) is :data:`NONFINITE_FRAME`."""
    return COMP | (getattr(tensor, "wire_flags", 0) & ASYNC) | \
        (NONFINITE if wire is NONFINITE_FRAME else 0)


#: the frame of a synchronous partition that held inf or NaN (wire.NONFINITE): no
#: compressor encodes them, and the round must still complete on every rank
NONFINITE_FRAME = np.empty(0, np.uint8)


def result_compressed(t) -> bool:
    """Whether task ``t``'s result is a compressed frame: a compressed synchronous round
    is; an asynchronous key's pull returns the servers' parameters uncompressed (they
    hold them in full precision: compressing parameters would lose the model)."""
    return t.comp is not None and not getattr(t.handle.tensor, "wire_flags", 0) & ASYNC


class CannotCompress(BytePSError):
    """A partition could not be compressed (its push_pull fails, the job goes on)."""


class Compression:
    """Compressed partitions of one worker (``Task.comp`` is a partition's pipeline), and the
    byte counts of every tensor (``bytes``: name -> [pushed raw, pushed wire, pulled raw,
    pulled wire]; read by the metrics).  ``rank``: for error messages."""

    def __init__(self, rank: int):
        self.rank = rank
        self.bytes: dict[str, list] = {}
        self.skips: SkipNotice | None = None   # tensors left uncompressed (rank 0)
        self.nonfinite_at: dict[str, float] = {}   # tensor -> when its inf/NaN was logged

    def compress(self, t, timeline=None) -> np.ndarray:
        """Partition ``t``'s compressed frame (momentum -> error feedback -> compressor);
        CannotCompress naming the tensor when it cannot be compressed (e.g. inf/NaN in the
        gradient).  ``timeline``: the engine's Timeline when tracing."""
        t0 = time.monotonic()
        src = t.src if t.src.dtype == np.float32 else t.src.astype(np.float32)
        try:
            wire = t.comp.compress(src, t.round)
        except ValueError as exc:
            outer = getattr(t.handle.tensor, "outer", None)    # DiLoCo's servers step it
            if (result_compressed(t) or outer) and not np.isfinite(src).all():
                return self._nonfinite(t, exc, outer)
            raise CannotCompress(f"worker rank {self.rank}: cannot compress tensor "
                              f"{t.handle.tensor.name!r} partition {t.part}: {exc}") from exc
        self.count(t.handle.tensor.name, t.src.nbytes, wire.nbytes, 0)
        _span(timeline, "compress", t, t0)
        return wire

    def _nonfinite(self, t, exc, outer) -> np.ndarray:
        """A partition with inf or NaN in a round every rank waits for (a synchronous
        one, or DiLoCo's outer round): it goes out as NONFINITE, the compressor's state
        unchanged, and counts as a push of NaN, as it would uncompressed."""
        name, now = t.handle.tensor.name, time.monotonic()
        if now - self.nonfinite_at.get(name, -1e9) < 10.0:      # one line per 10 s a tensor
            return NONFINITE_FRAME
        self.nonfinite_at[name] = now
        what = ("the servers' global parameters of the partition become NaN, as with an "
                "uncompressed outer gradient: keep the local model finite" if outer else
                "this round's result of the partition is NaN on every rank, as an "
                "uncompressed sum's would be: skip the step on every rank when a result is "
                "not finite (loss scaling does), or find where the gradient overflows")
        log.warning("worker rank %d: tensor %r partition %d holds inf or NaN, which is not "
                    "compressed (%s); %s", self.rank, name, t.part, exc, what)
        return NONFINITE_FRAME

    def decompress(self, t, e: Entry, frame, timeline=None) -> np.ndarray:
        """The float32 result of a compressed RESULT entry (raises CompressionError before
        writing anything).  A float32 output is decoded in place (no temporary)."""
        t0 = time.monotonic()
        out = t.handle.flat_out[t.start:t.start + t.length]
        if out.dtype != np.float32:
            out = np.empty(t.length, np.float32)
        buf = frame_bytes(frame)
        if e.flags & NONFINITE:       # the round's sum held inf or NaN (see _nonfinite)
            if buf.nbytes:
                raise ValueError(f"NONFINITE result {list(e)} with a {buf.nbytes}-byte frame")
            out.fill(np.nan)
            return out
        t.comp.decompress(buf, e.round, out)
        self.count(t.handle.tensor.name, 0, 0, t.src.nbytes, buf.nbytes)
        _span(timeline, "decompress", t, t0)
        return out

    def count(self, name: str, raw_out: int, wire_out: int, raw_in: int,
              wire_in: int | None = None) -> None:
        """Telemetry: bytes pushed and pulled per tensor, before and after compression."""
        b = self.bytes.get(name)
        if b is None:
            b = self.bytes[name] = [0, 0, 0, 0]
        b[0] += raw_out
        b[1] += wire_out
        b[2] += raw_in
        b[3] += raw_in if wire_in is None else wire_in

    def totals(self) -> dict:
        """This worker's bytes pushed and pulled, raw and on the wire (after compression),
        for the end-of-job summary and the live view."""
        tot = [0, 0, 0, 0]
        for b in list(self.bytes.values()):
            for i in range(4):
                tot[i] += b[i]
        return {"pushed": tot[0], "pushed_wire": tot[1], "pulled": tot[2],
                "pulled_wire": tot[3]}


def _span(tl, what: str, t, t0: float) -> None:
    if tl is not None and tl.traced(t.handle.id):
        tl.span(what, t0, time.monotonic(), cat="compress", tensor=t.handle.tensor.name,
                part=t.part)

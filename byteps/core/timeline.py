"""Timeline (Chrome-trace JSON per worker) and push-pull telemetry.

With ``BYTEPS_TRACE_ON=1`` every worker writes
``$BYTEPS_TRACE_DIR/<rank>/comm.json`` (the original BytePS layout), a
Chrome trace that Perfetto (ui.perfetto.dev) or chrome://tracing opens.
Steps come from :class:`StepCounter` (the training steps the plugins'
optimizers report through ``byteps.core.api.step_done``).  Operations that
begin in steps ``BYTEPS_TRACE_START_STEP`` .. ``BYTEPS_TRACE_END_STEP``
(inclusive) are recorded; with ``BYTEPS_TRACE_SAMPLE=N`` only one step in N of them
(start, start + N, ...), so a long job writes a bounded file.

Spans (``ph: "X"``, microseconds since the Unix epoch, so traces of several
workers on one machine line up):

* ``<tensor name>`` (cat ``tensor``): push_pull_async → last partition written.
* per partition (cat ``partition``), one after the other:
  ``queue`` (submitted → handed to the socket: priority queue + credit window),
  ``push`` (handed to the socket → the server's ACK of that push arrives:
  the upload, plus a small acknowledgement back),
  ``server+pull`` (ACK → result received: waiting for the other workers'
  pushes, the server's sum, and the pull transfer),
  ``copy_out`` (result → averaged into the output array).
* ``server_sum (est.)`` nested in ``server+pull``: **an estimate**, not a
  measurement — the server does not report timings (the RESULT header's
  entries are validated as six integers).  Its length is
  ``(workers - 1) x bytes / np.add rate`` measured on this host at start;
  it is drawn just before the pull, whose length is assumed equal to the
  push's (symmetric link).

Other stages (e.g. a local reduce) can be added with :meth:`Timeline.span`.
"""
from __future__ import annotations

import collections
import heapq
import json
import logging
import os
import threading
import time

import numpy as np

from byteps.common import variables

log = logging.getLogger("byteps.timeline")
SPEED_WINDOW_S = 10.0


class StepCounter:
    """The training steps of one worker (step 0 is everything before the first step ends).

    Explicit marks (:meth:`mark`) come from the plugins through
    ``byteps.core.api.step_done()``: torch ``DistributedOptimizer.step()``, the
    TensorFlow/Keras gradient exchange (``DistributedOptimizer`` and
    ``DistributedGradientTape``, one per step, also inside ``tf.function``),
    MXNet ``DistributedTrainer.step()``; numpy users may call
    ``byteps.numpy.step_done()``.  Implicit marks come from
    ``byteps.numpy.synchronize()`` when it leaves nothing in flight; they count
    only until the first explicit one.  A job that never marks a step (e.g. a loop
    of synchronous numpy push_pulls) counts one whenever a tensor name is pushed a
    second time since the current step began (:meth:`pushed`).  A broadcast
    before training is therefore part of step 0 and never starts a step.
    """

    def __init__(self):
        self.n = 0
        self.explicit = False
        self.marked = False
        self.seen: set[str] = set()
        self.listeners: list = []         # f(new step number), e.g. Timeline.on_step
        self.lock = threading.Lock()
        self.wait_s = 0.0                 # main thread blocked in synchronize (api/reporter.py)
        self.last = ""                    # the last push_pull synchronized
        self.waiting: tuple | None = None    # (name, since) while synchronize blocks
        self.mine: set = set()            # the main thread's push_pull handles (track)
        self.cap = 64

    def waited(self, name: str, seconds: float) -> None:
        """``synchronize`` of ``name`` returned after blocking ``seconds``."""
        self.wait_s += seconds
        self.last = name
        self.waiting = None

    def track(self, hid: int, handles) -> None:
        """Handle ``hid`` starts a push_pull, in any thread: remembered when the main
        thread (the user's loop) starts it; forgotten once no longer in ``handles`` (at
        :meth:`busy`, and whenever the remembered ids double)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.mine.add(hid)
        if len(self.mine) >= self.cap:      # a loop that never synchronizes all at once
            self.busy(handles)
            self.cap = max(64, 2 * len(self.mine))

    def busy(self, handles) -> bool:
        """Whether one of the loop's own push_pulls is among ``handles`` (in flight; main
        thread only).  Other threads' do not count: autotune's exchange from the last step
        end completes once the slowest rank has pushed it, so whether it is still in
        flight differs from rank to rank, and a background stage's timing does too; a
        step end decided from them would differ between the ranks."""
        if threading.current_thread() is not threading.main_thread():
            return any(h in handles for h in list(self.mine))     # (only main changes it)
        self.mine = {h for h in self.mine if h in handles}
        return bool(self.mine)

    def pushed(self, name: str) -> None:
        """A push_pull of ``name`` starts (only matters while no step was ever marked)."""
        if self.marked:
            return
        with self.lock:
            if name in self.seen:
                self.seen.clear()
                self._advance()
            self.seen.add(name)

    def mark(self, implicit: bool = False) -> bool:
        """The current step ended; returns whether it counted."""
        with self.lock:
            if implicit and self.explicit:
                return False
            self.explicit = self.explicit or not implicit
            self.marked = True
            self.seen.clear()
            self._advance()
            return True

    def _advance(self) -> None:
        self.n += 1
        for f in list(self.listeners):
            try:
                f(self.n)
            except Exception as exc:   # noqa: BLE001 - a listener must not break training
                log.warning("step listener %r failed: %s", f, exc)


class PushPullSpeed:
    """Recent push-pull throughput of this worker, like the original's telemetry.

    Counts the bytes of every completed partition (the bytes pushed; the
    same amount is pulled).  :meth:`get` returns ``(ms since epoch, MB/s)``
    over the last ``SPEED_WINDOW_S`` seconds (1 MB = 1e6 bytes).
    """

    def __init__(self, window_s: float = SPEED_WINDOW_S):
        self.window = window_s
        self.events: collections.deque = collections.deque()   # (monotonic, bytes)
        self.lock = threading.Lock()
        self.total_bytes = 0
        self.total_ops = 0
        self.busy_s = 0.0
        self.first: float | None = None
        self.last: float | None = None

    def add(self, nbytes: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self.lock:
            self.events.append((now, nbytes))
            self.total_bytes += nbytes
            if self.first is None:
                self.first = now
            self.last = now
            cut = now - self.window
            while self.events and self.events[0][0] < cut:
                self.events.popleft()

    def op_done(self, seconds: float) -> None:
        """One push_pull (a whole tensor) finished after ``seconds``."""
        with self.lock:
            self.total_ops += 1
            self.busy_s += seconds

    def get(self, now: float | None = None) -> tuple[int, float]:
        now = time.monotonic() if now is None else now
        with self.lock:
            ev = [e for e in self.events if e[0] >= now - self.window]
        ms = int(time.time() * 1000)
        if not ev:
            return ms, 0.0
        span = max(now - ev[0][0], 1e-3)
        return ms, float(sum(b for _, b in ev) / span / 1e6)

    def summary(self) -> dict:
        with self.lock:
            wall = (self.last - self.first) if self.first is not None else 0.0
            return {"push_pulls": self.total_ops, "bytes": self.total_bytes,
                    "active_s": round(wall, 6),
                    "avg_MBps": round(self.total_bytes / wall / 1e6, 3) if wall > 0 else 0.0}


def _add_rate() -> float:
    """Bytes per second that np.add sums on this host (16 MB float32, best of 3)."""
    a = np.ones(1 << 22, dtype=np.float32)
    b = np.ones_like(a)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t)
    return a.nbytes / max(best, 1e-9)


class Timeline:
    """Collects spans of one worker and writes them as a Chrome trace."""

    def __init__(self, trace_dir: str, rank: int, size: int, start_step: int, end_step: int,
                 steps: StepCounter | None = None, sample: int | None = None):
        self.steps = StepCounter() if steps is None else steps
        self.steps.listeners.append(self.on_step)
        self.path = os.path.join(trace_dir, str(rank), "comm.json")
        self.rank, self.size = rank, size
        self.start_step, self.end_step = start_step, end_step
        if sample is None:
            sample = variables.value("BYTEPS_TRACE_SAMPLE")   # raises ConfigError if bad
        self.sample = max(1, int(sample))      # one step in N
        self.offset = time.time() - time.monotonic()
        self.lock = threading.Lock()
        self.ops: dict[int, tuple] = {}        # handle id -> (name, step, t0)
        self.untraced: tuple = ()              # name prefixes of byteps's own exchanges
        self.tensor_spans: list[tuple] = []    # (start, end, name, args)
        self.part_spans: list[list] = []       # [(start, end, name, args), ...] per partition
        self.extra: list[tuple] = []           # free spans: (start, end, name, cat, args)
        self.push_done: dict[tuple, float] = {}   # (handle id, part) -> server's ACK
        self.add_rate = _add_rate()
        self.written = False
        log.info("timeline on: steps %d..%d -> %s", start_step, end_step, self.path)

    # -------------------------------------------------------------- user thread
    @property
    def step(self) -> int:
        """The current step (see :class:`StepCounter`)."""
        return self.steps.n

    def on_step(self, n: int) -> None:
        """Step ``n`` began: the window is complete when ``n`` is END_STEP + 1."""
        if n == self.end_step + 1:
            self.write()

    def begin(self, hid: int, name: str, t0: float) -> None:
        """A push_pull starts; returns nothing, records it if its step is traced."""
        step = self.steps.n
        if self.start_step <= step <= self.end_step and \
                not (step - self.start_step) % self.sample and not name.startswith(self.untraced):
            with self.lock:
                self.ops[hid] = (name, step, t0)

    def traced(self, hid: int) -> bool:
        return hid in self.ops

    # -------------------------------------------------------------- engine thread
    def acked(self, t, now: float) -> None:
        """The server acknowledged the push of partition task ``t``."""
        if t.handle.id in self.ops:
            self.push_done[(t.handle.id, t.part)] = now

    def part_done(self, t, t_result: float, t_written: float) -> None:
        """Record the stages of partition task ``t`` (see the module docstring)."""
        h = t.handle
        op = self.ops.get(h.id)
        if op is None:
            return
        name, step, t0 = op
        sent = getattr(t, "sent_at", None) or t0
        pushed = min(max(self.push_done.pop((h.id, t.part), t_result), sent), t_result)
        args = {"tensor": name, "part": t.part, "bytes": int(t.nbytes), "server": t.server,
                "step": step}
        spans = [(t0, sent, "queue", args), (sent, pushed, "push", args),
                 (pushed, t_result, "server+pull", args),
                 (t_result, t_written, "copy_out", args)]
        if self.size > 1:
            est = (self.size - 1) * t.nbytes / self.add_rate
            end = min(t_result, max(pushed + est, t_result - (pushed - sent)))
            start = max(pushed, end - est)
            spans.append((start, end, "server_sum (est.)",
                          dict(args, estimated=True, est_us=round(est * 1e6, 1))))
        with self.lock:
            self.part_spans.append(spans)

    def handle_done(self, h, t_end: float) -> None:
        with self.lock:
            op = self.ops.pop(h.id, None)
            if op is None:
                return
            name, step, t0 = op
            nbytes = int(h.out.nbytes)
            self.tensor_spans.append((t0, t_end, name, {"bytes": nbytes, "step": step,
                                                        "failed": h.error is not None}))

    def span(self, name: str, start: float, end: float, cat: str = "stage", **args) -> None:
        """Record any other span (monotonic-clock seconds), e.g. a local reduce."""
        with self.lock:
            self.extra.append((start, end, name, cat, args))

    # -------------------------------------------------------------- output
    def _us(self, t: float) -> float:
        return round((t + self.offset) * 1e6, 1)

    def events(self) -> list[dict]:
        pid = self.rank
        with self.lock:
            tensors = sorted(self.tensor_spans)
            parts = sorted(self.part_spans, key=lambda s: s[0][0])
            extra = sorted(self.extra, key=lambda x: x[:2])
        evs = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": f"byteps worker rank {self.rank}"}}]
        lanes = _lanes([(s[0], s[1]) for s in tensors])
        for (start, end, name, args), lane in zip(tensors, lanes):
            evs.append(self._x(name, "tensor", pid, 1000 + lane, start, end, args))
        lanes = _lanes([(p[0][0], p[3][1]) for p in parts])
        for spans, lane in zip(parts, lanes):
            for start, end, name, args in spans:
                evs.append(self._x(name, "partition", pid, 1 + lane, start, end, args))
        lanes = _lanes([(x[0], x[1]) for x in extra])
        for (start, end, name, cat, args), lane in zip(extra, lanes):
            evs.append(self._x(name, cat, pid, 2000 + lane, start, end, args))
        used = sorted({e["tid"] for e in evs if e["ph"] == "X"})
        for tid in used:
            label = (f"tensors {tid - 1000}" if 1000 <= tid < 2000 else
                     f"other stages {tid - 2000}" if tid >= 2000 else f"partitions {tid - 1}")
            evs.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": label}})
        return evs

    def _x(self, name, cat, pid, tid, start, end, args) -> dict:
        return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                "ts": self._us(start), "dur": round(max(end - start, 0.0) * 1e6, 1),
                "args": args}

    def write(self) -> str:
        """Write (or rewrite) the trace file atomically; returns its path."""
        doc = {"traceEvents": self.events(), "displayTimeUnit": "ms",
               "otherData": {"rank": self.rank, "workers": self.size,
                             "start_step": self.start_step, "end_step": self.end_step,
                             "sample": self.sample,
                             "np_add_bytes_per_s": round(self.add_rate),
                             "note": "server_sum (est.) spans are estimates"}}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)
        self.written = True
        return self.path


def _lanes(intervals: list[tuple]) -> list[int]:
    """Greedy interval partitioning (intervals sorted by start): a lane per overlap."""
    free: list[tuple] = []       # (end, lane)
    out, nlanes = [], 0
    for start, end in intervals:
        if free and free[0][0] <= start:
            _, lane = heapq.heappop(free)
        else:
            lane, nlanes = nlanes, nlanes + 1
        out.append(lane)
        heapq.heappush(free, (end, lane))
    return out

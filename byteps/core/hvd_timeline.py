"""Horovod's timeline: one Chrome-trace file that rank 0 writes while the job runs.

``HOROVOD_TIMELINE=PATH`` (``BYTEPS_TIMELINE``) at ``init()``, or ``start_timeline(PATH,
mark_cycles)`` at any time, as in Horovod (horovod/common/timeline.cc):

* only rank 0 writes (Horovod's coordinator); the other ranks record nothing;
* the file is a JSON array that stays valid after every write: it ends in ``]``, which
  the next write replaces; pid 0 carries ``start_time_since_epoch_in_micros`` and every
  ``ts`` counts microseconds from the timeline's start;
* every operation's tensor is a "process" named ``<kind>.<name>`` (``allreduce.fc.weight``;
  a ``push_pull`` is an allreduce) whose thread 0 shows Horovod's phases:
  ``NEGOTIATE_<KIND>`` with a tick named by this rank at the call, then ``<KIND>`` with
  ``dtype``, ``shape`` and ``bytes`` in its args;
* ``CYCLE_START`` markers (``mark_cycles``): each time the engine thread takes newly
  submitted work, byteps' analogue of Horovod's background cycle.

What the phases measure here (byteps has no coordinator that negotiates tensors):
``NEGOTIATE_<KIND>`` is the agreement exchange of a collective that has one (allgather,
broadcast, alltoall, reducescatter: the ranks agree on shapes and types) and, for an
allreduce, the wait from the call until its first partition goes to a server (the priority
queue and the credit window); ``<KIND>`` runs from there until the result is written,
and the partitions' ``push`` (to the server's acknowledgement) and ``server+pull`` (to the
result: the other ranks' pushes, the sum, the download) are on threads 1.. of the same
process.  Under local reduction (several ranks on a host) the whole exchange is
``<KIND>``: its stages are in ``BYTEPS_TRACE_ON``'s per-rank trace (docs/timeline.md).

The engine thread only formats records and queues them; a writer thread does the I/O.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import queue
import threading
import time

from byteps.core.timeline import _lanes

log = logging.getLogger("byteps.timeline")

# (kind, name) of the collective whose exchanges the current thread starts
_COLLECTIVE: contextvars.ContextVar = contextvars.ContextVar("byteps_collective",
                                                              default=None)
OWN = "byteps."               # the prefix of byteps's own exchanges (autotune's): not shown


@contextlib.contextmanager
def collective(kind: str, name: str, inner: bool = False):
    """The push_pulls started inside belong to the ``kind`` operation ``name``; ``inner``:
    unless they already belong to one (a checked broadcast's exchange)."""
    if inner and _COLLECTIVE.get() is not None:
        yield
        return
    token = _COLLECTIVE.set((kind, name))
    try:
        yield
    finally:
        _COLLECTIVE.reset(token)


class Record:
    """One push_pull of the timeline: filled by the engine, emitted once when done."""
    __slots__ = ("tl", "label", "kind", "phase", "t0", "parts", "acks", "emitted")

    def __init__(self, tl: "HorovodTimeline", label: str, kind: str, phase: str, t0: float):
        self.tl, self.label, self.kind, self.phase, self.t0 = tl, label, kind, phase, t0
        self.parts: list[tuple] = []       # (part, server, bytes, sent, result)
        self.acks: dict[int, float] = {}   # part -> the server's ACK of its push
        self.emitted = False

    def part(self, t, t_result: float) -> None:
        """Partition task ``t`` came back at ``t_result`` (engine thread)."""
        self.parts.append((t.part, t.server, int(t.nbytes), t.sent_at or self.t0, t_result))

    def finish(self, h) -> None:
        """Handle ``h`` completed or failed: write this record (once).  Never raises: it
        runs before the handle's waiters wake."""
        try:
            self.tl.emit(self, h)
        except Exception as exc:        # a timeline must not fail the operation
            log.warning("timeline: %s not recorded: %r", self.label, exc)


class HorovodTimeline:
    """Horovod's timeline file, written by a thread of its own (see the module doc)."""

    def __init__(self, path: str, rank: int, mark_cycles: bool = False):
        self.path, self.rank, self.mark_cycles = path, rank, bool(mark_cycles)
        self.from_env = False       # HOROVOD_TIMELINE's: kept across shutdown()/init()
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.pids: dict[str, int] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        try:
            self.file = open(path, "wb")
        except OSError as exc:
            raise ValueError(f"timeline file {path!r} cannot be written on rank {rank}: "
                             f"{exc}; give a path in a writable folder") from None
        epoch_us = int(time.time() * 1e6)
        self._write([{"name": "process_name", "ph": "M", "pid": 0,
                      "args": {"start_time_since_epoch_in_micros": epoch_us}},
                     {"name": "process_sort_index", "ph": "M", "pid": 0,
                      "args": {"sort_index": 0}}])
        self.thread = threading.Thread(target=self._writer, name="bps-timeline", daemon=True)
        self.thread.start()
        log.info("Horovod timeline on rank %d -> %s%s", rank, path,
                 " (cycles marked)" if self.mark_cycles else "")

    # ------------------------------------------------------------ recording
    def begin(self, name: str, t0: float) -> Record | None:
        """A push_pull of ``name`` starts at ``t0``: its record, or None (not traced)."""
        if name.startswith(OWN):
            return None
        ctx = _COLLECTIVE.get()
        kind, op = ctx if ctx is not None else ("allreduce", name)
        phase = "op" if name == op else "negotiate" if name.startswith(op + ".meta") \
            else "data"
        label = op if op.startswith(kind + ".") else f"{kind}.{op}"
        return Record(self, label, kind.upper(), phase, t0)

    def cycle(self) -> None:
        """The engine thread took newly submitted work."""
        if self.mark_cycles:
            self.queue.put([{"ph": "i", "name": "CYCLE_START", "ts": self._us(time.monotonic()),
                             "s": "g"}])

    def emit(self, rec: Record, h) -> None:
        with self.lock:
            if rec.emitted:
                return
            rec.emitted = True
            evs, pid = self._pid(rec.label)
        end = time.monotonic()
        out = getattr(h, "out", None)
        args = {} if out is None else {"dtype": str(out.dtype), "shape": str(tuple(out.shape)),
                                       "bytes": int(out.nbytes)}
        if getattr(h, "error", None) is not None:
            args["error"] = str(h.error)[:300]
        tick = self._x(str(self.rank), pid, 0, rec.t0, rec.t0)
        if rec.phase == "negotiate":
            evs += [self._x(f"NEGOTIATE_{rec.kind}", pid, 0, rec.t0, end), tick]
        elif rec.phase == "data":
            evs.append(self._x(rec.kind, pid, 0, rec.t0, end, args))
        else:
            first = min((p[3] for p in rec.parts), default=rec.t0)
            evs += [self._x(f"NEGOTIATE_{rec.kind}", pid, 0, rec.t0, first), tick,
                    self._x(rec.kind, pid, 0, first, end, args)]
        parts = sorted(rec.parts, key=lambda p: p[3])
        for (part, server, nbytes, sent, result), lane in zip(
                parts, _lanes([(p[3], p[4]) for p in parts])):
            acked = min(max(rec.acks.get(part, sent), sent), result)
            a = {"part": part, "server": server, "bytes": nbytes}
            evs += [self._x("push", pid, 1 + lane, sent, acked, a),
                    self._x("server+pull", pid, 1 + lane, acked, result, a)]
        self.queue.put(evs)

    def stop(self) -> None:
        """Write everything queued and close the file."""
        self.queue.put(None)
        self.thread.join(timeout=10)
        try:
            self.file.close()
        except OSError:
            pass

    # ------------------------------------------------------------ output
    def _pid(self, label: str) -> tuple[list, int]:
        pid = self.pids.get(label)
        if pid is not None:
            return [], pid
        pid = self.pids[label] = len(self.pids) + 1
        return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}},
                {"name": "process_sort_index", "ph": "M", "pid": pid,
                 "args": {"sort_index": pid}}], pid

    def _us(self, t: float) -> int:
        return int((t - self.start) * 1e6)

    def _x(self, name: str, pid: int, tid: int, start: float, end: float,
           args: dict | None = None) -> dict:
        ev = {"ph": "X", "name": name, "ts": self._us(start), "pid": pid, "tid": tid,
              "dur": max(0, int((end - start) * 1e6))}
        if args:
            ev["args"] = args
        return ev

    def _write(self, events: list[dict]) -> None:
        """Append ``events``, leaving a valid JSON array (Horovod's "]" kept last)."""
        body = ",\n".join(json.dumps(e, separators=(", ", ": ")) for e in events).encode()
        if self.file.tell() == 0:
            self.file.write(b"[\n" + body + b"]")
        else:
            self.file.seek(-1, 2)
            self.file.write(b",\n" + body + b"]")
        self.file.flush()

    def _writer(self) -> None:
        while True:
            batch = self.queue.get()
            stop = batch is None
            events = [] if stop else list(batch)
            while not stop:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    events += more
            if events:
                try:
                    self._write(events)
                except (OSError, ValueError) as exc:
                    log.warning("timeline %s: cannot write (%s); it stops here", self.path,
                                exc)
                    return
            if stop:
                return

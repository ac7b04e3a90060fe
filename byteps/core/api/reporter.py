"""What a worker tells the scheduler with each heartbeat: its step, the step time split into
compute and communication wait, throughput, bytes per step, per-server round latency, the
last operation it completed and, while its step does not advance, the Python stack of every
thread (the hang doctor: byteps/dashboard/doctor.py names the stuck line of code).

The body is built on the engine thread when the heartbeat is due (``SchedulerLink.beat``),
from counters the main thread updates; stacks are read with ``sys._current_frames()`` there,
never from a signal handler.  ``SIGUSR1`` (when the process has no handler of its own) only
records the request; the next heartbeat prints this process's stacks to stderr.  Everything
sent is plain numbers and strings (msgpack), which the scheduler validates field by field.
"""
from __future__ import annotations

import collections
import os
import signal
import sys
import threading
import time
import traceback

from byteps.core.collective import rules as _rules
from byteps.core.engine import deadlock as _deadlock

MAX_FRAMES = 12          # frames per thread, innermost last
MAX_THREADS = 16
STEP_WINDOW = 20         # steps averaged for the step time split
COMP_EVERY_S = 2.0       # the compression summary and bytes per step are refreshed this often

_SIGUSR1: list = []      # SIGUSR1 received (the handler only appends: no lock)


class Reporter:
    """One per engine (``attach``); ``body()`` is the heartbeat body."""

    def __init__(self, st):
        self.st = st
        self.eng = st.engine
        self.main = threading.main_thread().ident
        self.steps = st.steps
        self.t_step = time.monotonic()           # when the current step began
        self.wait_mark = 0.0
        self.bytes_mark = (0, 0)                 # (step, raw bytes pushed) at the last beat
        self.bytes_step = 0
        self.window: collections.deque = collections.deque(maxlen=STEP_WINDOW)
        self.prev_rounds: tuple | None = None
        self.last_srv: list = []
        self.prev_push, self.last_push = (0, 0.0), -1.0
        self.comp: dict = {}
        self.comp_at = 0.0
        self.quiet_s = max(1.0, min(st.cfg.stall_warning_s / 2, 10.0))
        self.steps.listeners.append(self.on_step)

    def on_step(self, n: int) -> None:
        """Step ``n`` began (main thread): one (step time, wait) sample."""
        now = time.monotonic()
        wait = self.steps.wait_s
        if n > 1:        # step 0 holds the start-up (broadcasts, first connections): not a step
            self.window.append((now - self.t_step, wait - self.wait_mark))
        self.t_step, self.wait_mark = now, wait

    def rounds(self) -> list:
        """Mean round latency (ms) per server since the last heartbeat (the previous value
        when none completed since; -1: never)."""
        n, sums = self.eng.rounds.snapshot()
        prev = self.prev_rounds or ([0] * len(n), [0.0] * len(n))
        self.prev_rounds = (n, sums)
        last = self.last_srv if len(self.last_srv) == len(n) else [-1.0] * len(n)
        self.last_srv = [round((s - ps) / (k - pk) * 1e3, 3) if k > pk else old
                         for k, s, pk, ps, old in zip(n, sums, prev[0], prev[1], last)]
        return self.last_srv

    def push_ms(self) -> float:
        """Mean upload time (ms: push handed to the socket -> the server's ACK) since the
        last heartbeat, over every server (the previous value when none; -1: never)."""
        r = self.eng.rounds
        n, total = sum(r.push_n), sum(r.push_sums)
        pn, pt = self.prev_push
        self.prev_push = (n, total)
        if n > pn:
            self.last_push = round((total - pt) / (n - pn) * 1e3, 3)
        return self.last_push

    def body(self) -> dict:
        now = time.monotonic()
        win = list(self.window)
        k = len(win) or 1
        step_ms = sum(w[0] for w in win) / k * 1e3
        wait_ms = sum(w[1] for w in win) / k * 1e3
        last = self.steps.last
        step = self.steps.n
        if now >= self.comp_at:  # walks every tensor: at most every COMP_EVERY_S seconds
            self.comp, self.comp_at = _compression(self.st, self.eng), now + COMP_EVERY_S
            raw = self.comp["raw"]
            if step > self.bytes_mark[0]:       # raw bytes pushed per step since then
                self.bytes_step = (raw - self.bytes_mark[1]) // (step - self.bytes_mark[0])
                self.bytes_mark = (step, raw)
        comp = dict(self.comp)
        raw = comp.pop("raw")
        rep = {"step": step,
               "MBps": round(self.eng.speed.get(now)[1], 3), "bytes": int(raw),
               "bytes_step": int(max(0, self.bytes_step)),
               "srv_ms": self.rounds(), "push_ms": self.push_ms(), "pid": os.getpid(),
               "in_step_s": round(now - self.t_step, 3), "last": str(last)[:200],
               "inflight": len(self.eng.inflight),
               "mode": "async" if self.st.cfg.enable_async else "sync", **comp}
        if win:          # no step time before the first step after start-up
            rep["step_ms"], rep["wait_ms"] = round(step_ms, 3), round(min(wait_ms, step_ms), 3)
        waiting = self.steps.waiting
        if waiting is not None:
            rep["waiting"] = str(waiting[0])[:200]     # (set after ``now`` was read: >= 0)
            rep["waiting_s"] = round(max(0.0, now - waiting[1]), 3)
        blocked = _blocked(self.st)
        if blocked is not None:  # the scheduler's deadlock detection (core/engine/deadlock.py)
            rep["blocked"] = blocked
        rep["gen"] = list(_rules.generation())      # and its "behind" rule: any thread's
        waits = _deadlock.waits()                    # waits, with this rank's generation
        if waits or self.st.handles:                 # (and what it started, waiting or not)
            started = _started(self.st)
            if started is not None:
                rep["waits"] = {"names": [w[0][:MAX_NAME] for w in waits[:MAX_WAITS]],
                                "s": round(waits[0][1] if waits else 0.0, 3),
                                "started": started, "sets": _sets()}
        tl = self.eng.timeline or self.eng.hvd_timeline     # BYTEPS_TRACE_ON / Horovod's
        if tl is not None:        # timeline (written as it goes): the page names the file
            rep["trace"] = str(tl.path)[-300:]
            rep["trace_written"] = bool(getattr(tl, "written", True))
        tuner = getattr(self.st, "tuner", None)
        if tuner is not None:
            rep["tune"] = _tuning(tuner, self.st.cfg)
        asked = getattr(self.st.link, "stacks_asked", False)     # bpslaunch --stacks
        if asked:
            self.st.link.stacks_asked = False
        if now - self.t_step >= self.quiet_s or _SIGUSR1 or asked:
            rep["stacks"] = stacks(self.main)
            if _SIGUSR1:
                _SIGUSR1.clear()
                _print_stacks(rep["stacks"])
        return rep


def _blocked(st) -> dict | None:
    """What the main thread waits for: ``names`` (how the ranks name it), ``s`` (since),
    ``started`` (every name this rank started and has not synchronized, and the latest it
    finished: a name another rank waits for and this one finished can complete) and ``sets``
    (process sets exist: the scheduler then never declares a deadlock, since a set's
    operation needs only its members).  None: not blocked in a BytePS wait."""
    from byteps.core.collective import handles
    cur = _deadlock.current()
    if cur is None:
        return None
    (kind, ref), secs = cur
    with handles._busy_lock:
        busy = dict(handles._BUSY_BY_HANDLE)
    started = _started(st, busy)
    if started is None:
        return None
    started = set(started)
    if kind == "barrier":
        names = [f"barrier {ref!r}"]
        started.add(names[0])
    elif ref in busy:
        names = [f"{busy[ref][0]} {busy[ref][1]!r}"]
    elif ref in st.handles:
        names = [f"push_pull {getattr(st.handles[ref].tensor, 'name', '')!r}"]
    else:
        return None
    if len(started) > MAX_STARTED:      # cut, the list could hide a name: never a deadlock
        return None
    return {"names": [x[:MAX_NAME] for x in names], "s": round(secs, 3),
            "started": sorted(started), "sets": _sets()}


def _sets() -> bool:
    """Whether process sets other than the global one exist (an operation of a set needs
    only its members: the scheduler's rules then stand aside)."""
    from byteps.core.collective import process_sets
    return bool(process_sets._SETS)


def _started(st, busy: dict | None = None) -> list | None:
    """Every name this rank started and has not synchronized, and the latest it finished (a
    name another rank waits for and this one finished can complete), as the reports spell
    them; None when there are more than the scheduler takes (a cut list could hide one)."""
    from byteps.core.collective import handles
    if busy is None:
        with handles._busy_lock:
            busy = dict(handles._BUSY_BY_HANDLE)
    started = {f"{k} {n!r}" for k, n in busy.values()}
    started.update(f"push_pull {getattr(h.tensor, 'name', '')!r}"
                   for hid, h in list(st.handles.items()) if hid not in busy)
    started.update(_deadlock.finished())
    started = {x[:MAX_NAME] for x in started}
    return None if len(started) > MAX_STARTED else sorted(started)


MAX_STARTED, MAX_NAME, MAX_WAITS = 256, 300, 8  # the scheduler's limits (scheduler/deadlock.py)


def _tuning(tuner, cfg) -> dict:
    """Autotune's state and current setting: partition bytes and credit window."""
    out = {"state": str(getattr(tuner, "state", ""))[:40],
           "partition_bytes": int(getattr(tuner, "partition", cfg.partition_bytes) or 0),
           "credit_bytes": int(cfg.credit_bytes or 0)}
    if getattr(tuner, "choice", None):
        out["chosen"] = [int(v) for v in tuner.choice[:2]]
    return out


def _compression(st, eng) -> dict:
    """The compressors in use (from the declarations) and pushed raw / wire bytes."""
    names = sorted({getattr(s, "compressor", "") for s in list(st.declared.values())
                    if s is not None} - {""})
    raw = wire = 0
    for b in list(eng.bytes.values()):
        raw, wire = raw + b[0], wire + b[1]
    return {"comp": ",".join(names)[:200] or "none", "raw": raw,
            "ratio": round(raw / wire, 3) if wire else 1.0}


def stacks(main_ident: int | None = None) -> list:
    """``[[thread name, [[file, line, function], ...]], ...]``, the main thread first,
    innermost frame last; our own threads (byteps-*) are left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda i: (i != main_ident, names.get(i, "")))
    out = []
    for ident in order:
        name = names.get(ident, f"thread {ident}")
        if name.startswith("byteps-") or ident == threading.get_ident():
            continue
        summary = traceback.extract_stack(frames[ident], limit=MAX_FRAMES)
        out.append([("MainThread" if ident == main_ident else name)[:80],
                    [[f.filename[-160:], int(f.lineno or 0), f.name[:80]] for f in summary]])
        if len(out) >= MAX_THREADS:
            break
    return out


def _print_stacks(threads: list) -> None:
    lines = [f"byteps: stacks of pid {os.getpid()} (SIGUSR1):"]
    for name, frames in threads:
        lines.append(f"  thread {name}:")
        lines.extend(f"    {f}:{ln} in {fn}()" for f, ln, fn in frames)
    try:
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _on_usr1(signum, frame) -> None:
    _SIGUSR1.append(signum)  # only record; the engine thread prints at its next heartbeat


def attach(st) -> None:
    """After ``init()``: the scheduler link's heartbeats carry this worker's report."""
    if st.link is None or st.engine is None:
        return
    st.link.beat = Reporter(st).body
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGUSR1, _on_usr1)
        except (ValueError, OSError):
            pass

"""bpslaunch's signals: the handler only records; a thread of its own acts.

A signal handler runs between two bytecodes of the main thread, wherever it is:
inside ``say()`` holding the output lock, inside ``terminate()``, inside a
``finally``.  A handler that prints, takes a lock or ends the job from there can
deadlock (a second SIGTERM while the first one's message is printed) or cut a
clean-up in half.  So the handler here appends the signal number to a list and
returns, and ``signal.set_wakeup_fd`` wakes the *escalation thread*, which acts
however busy or blocked the main thread is.

Escalation (documented in docs/fault_tolerance.md):

1. SIGINT (Ctrl-C) once the workers run: SIGINT to the workers (their
   ``except KeyboardInterrupt`` and ``finally`` blocks run); after
   ``--grace-period`` seconds, step 2.
2. SIGTERM (or SIGINT before the workers started, or a second signal): SIGTERM
   to every process of the job; after ``TERM_GRACE_S`` seconds, step 3.
3. A further signal: SIGKILL to every process of the job, at once.

Signals that arrive within ``FOLD_S`` of the last step are part of the same
burst and count once (``timeout`` sends SIGTERM twice at once; a container
runtime may repeat it), so a burst ends the job gracefully, and a person pressing
Ctrl-C again a moment later escalates.
"""
from __future__ import annotations

import atexit
import os
import select
import signal
import threading
import time

FOLD_S = 0.5

# what the handler records, and all it does
RECEIVED: list[int] = []


def _record(signum, _frame) -> None:
    RECEIVED.append(signum)


class Escalation:
    """The one escalation thread of this bpslaunch process; acts on the current job."""

    def __init__(self):
        self.job = None
        self.level = 0              # 0: none, 1: SIGINT sent, 2: SIGTERM sent, 3: SIGKILL
        self.first: int | None = None
        self.stepped = float("-inf")
        self.deadline: float | None = None
        self.late = 0               # workers still running when the grace period ended
        r, w = os.pipe()
        os.set_blocking(w, False)
        os.set_blocking(r, False)
        self._r = r
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _record)
        atexit.register(_ignore_late_signals)
        threading.Thread(target=self._run, daemon=True, name="bpslaunch-signals").start()

    def adopt(self, job) -> None:
        """``job`` is the one to act on (a restart's new incarnation); a signal received
        before it existed applies to it too."""
        self.job = job
        if self.first is not None:
            job.signalled = self.first
            job.interrupted = job.interrupted or time.monotonic()

    def _run(self) -> None:
        while True:
            wait = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            if self.level >= 3:
                wait = 0.2          # processes started meanwhile (a race with start-up) die too
            ready, _, _ = select.select([self._r], [], [], wait)
            data = b""
            if ready:
                try:
                    data = os.read(self._r, 4096)
                except (BlockingIOError, InterruptedError):
                    pass
            try:
                for signum in data:
                    self._on(signum)
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.deadline = None
                    self._step(None)
                if self.level >= 3 and self.job is not None:
                    self.job.kill_all(signal.SIGKILL)
            except Exception as exc:  # noqa: BLE001 (never let this thread die)
                _say(f"signal handling: {exc!r}")

    def _on(self, signum: int) -> None:
        if signum not in (signal.SIGINT, signal.SIGTERM):
            return
        now = time.monotonic()
        job = self.job
        if self.first is None:
            self.first = signum
            if job is not None:
                job.signalled = signum
                job.interrupted = now
        if now - self.stepped < FOLD_S:
            return                          # the same burst
        self._step(signum)

    def _step(self, signum: int | None) -> None:
        """One step up the escalation (``signum`` None: a grace period ran out)."""
        job = self.job
        self.stepped = time.monotonic()
        if job is None:
            return
        from byteps.launcher.supervise import GRACE_PERIOD_S, TERM_GRACE_S
        name = signal.Signals(signum).name if signum else ""
        quiet = job.finished
        if self.level == 0 and signum == signal.SIGINT and job.workers is not None:
            self.level = 1
            alive = [w for w in job.workers if w.p.poll() is None]
            for w in alive:     # (signals first: a blocked output must not delay them)
                w.kill(signal.SIGINT)
            if not quiet:
                _say(f"received SIGINT; sent SIGINT to {len(alive)} worker(s); SIGTERM in "
                     f"{GRACE_PERIOD_S:g} s (--grace-period), then SIGKILL (a signal again: "
                     f"SIGTERM now)")
            self.deadline = self.stepped + GRACE_PERIOD_S
        elif self.level <= 1:
            again = " again" if self.level == 1 else ""
            if self.level == 1:
                self.late = sum(1 for w in job.workers or [] if w.p.poll() is None)
            self.level = 2
            job.kill_all(signal.SIGTERM)
            if quiet:
                pass
            elif signum is None:
                _say(f"{self.late} worker(s) still running after the {GRACE_PERIOD_S:g} s "
                     f"grace period: SIGTERM, then SIGKILL after {TERM_GRACE_S:g} s")
            else:
                _say(f"received {name}{again}; ending the job: SIGTERM to every process, "
                     f"SIGKILL in {TERM_GRACE_S:g} s (another signal: now)")
            self.deadline = self.stepped + TERM_GRACE_S
        elif self.level == 2:
            self.level = 3
            self.deadline = None
            job.kill_all(signal.SIGKILL)
            if not quiet:
                _say(f"received {name}: SIGKILL to every process of the job" if name else
                     f"processes still running {TERM_GRACE_S:g} s after SIGTERM: SIGKILL")


def _ignore_late_signals() -> None:
    """bpslaunch is exiting (nothing of the job runs): the end of a burst must not kill it
    with the default action (Python resets its handlers to the default as it finalizes),
    which would replace its exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _say(text: str) -> None:
    from byteps.launcher.supervise import say
    say(text)


_ESCALATION: Escalation | None = None


def install(job) -> None:
    """Route SIGINT and SIGTERM to the escalation thread, acting on ``job`` (from the main
    thread; elsewhere nothing is installed)."""
    global _ESCALATION
    if threading.current_thread() is not threading.main_thread():
        return
    if _ESCALATION is None:
        _ESCALATION = Escalation()
    _ESCALATION.adopt(job)


def level() -> int:
    """How far the escalation went (0: no signal acted on)."""
    return _ESCALATION.level if _ESCALATION is not None else 0


def late_workers() -> int:
    return _ESCALATION.late if _ESCALATION is not None else 0

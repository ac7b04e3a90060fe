"""bpslaunch's live view: one status line per worker while a standalone job runs.

Every worker writes ``worker<rank>.live`` (JSON,
:class:`byteps.core.api.worker_metrics.StatusWriter`) into the launcher's summary folder every
``BPSLAUNCH_LIVE_S`` seconds; the launcher polls those files from its supervision loop
(no sockets).

* On a terminal (stderr is a TTY) the lines are redrawn in place below the job's
  output, about once a second (ANSI: cursor up, erase).  Before any other output
  reaches the terminal the block is erased, so output and status never mix; for
  that the children's output goes through bpslaunch's pipes while the view is on.
* Otherwise (a log file, CI) the same lines are printed every
  ``BYTEPS_LIVE_INTERVAL_S`` seconds (default 30) as ``bpslaunch: INFO ...`` lines:
  when that variable is set, with ``--live``, or with ``BYTEPS_LOG_LEVEL`` INFO or
  lower.  ``--no-live`` turns both off.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping

from byteps.common import variables
from byteps.common.config import LOG_LEVELS, ConfigError
from byteps.launcher import supervise

DEFAULT_INTERVAL_S = variables.default("BYTEPS_LIVE_INTERVAL_S")
TTY_REFRESH_S = 1.0


def interval(env: Mapping[str, str]) -> float:
    """``BYTEPS_LIVE_INTERVAL_S`` (seconds between log lines); raises ConfigError."""
    raw = (env.get("BYTEPS_LIVE_INTERVAL_S") or "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"BYTEPS_LIVE_INTERVAL_S={raw!r} is not a positive number of "
                          f"seconds (e.g. 30)")
    return value


def mode(flag: bool | None, env: Mapping[str, str], stream=None) -> str | None:
    """``"tty"`` (redrawn lines), ``"log"`` (periodic lines) or None (off)."""
    stream = sys.stderr if stream is None else stream
    if flag is False:
        return None
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty and env.get("TERM") != "dumb":
        return "tty"
    raw = env.get("BYTEPS_LOG_LEVEL") or variables.default("BYTEPS_LOG_LEVEL")
    level = LOG_LEVELS.get(raw.strip().upper(), 30)
    if flag or env.get("BYTEPS_LIVE_INTERVAL_S") or level <= LOG_LEVELS["INFO"]:
        return "log"
    return None


def worker_period(kind: str, every: float) -> float:
    """How often workers write their status file (BPSLAUNCH_LIVE_S)."""
    return min(TTY_REFRESH_S if kind == "tty" else every, every, 1.0) / 2


def line(doc: dict | None, rank: int, now: float, stale_after: float) -> str:
    """One status line of worker ``rank`` (``doc``: its status file, or None)."""
    if doc is None:
        return f"worker {rank}: starting"
    text = (f"worker {rank} ({doc.get('host', '?')}): step {doc.get('step', 0)}, push_pull "
            f"{doc.get('MBps', 0.0):.1f} MB/s")
    raw, wire = doc.get("pushed", 0), doc.get("pushed_wire", 0)
    if isinstance(raw, int) and isinstance(wire, int) and 0 < wire < raw:
        text += f" (compressed: {wire / 1e6:.1f} MB on the wire for {raw / 1e6:.1f} MB pushed)"
    rnd = doc.get("round_ms")
    text += f", round {rnd:.1f} ms" if isinstance(rnd, (int, float)) else ", round -"
    slow = doc.get("slowest_server")
    if isinstance(slow, int):
        text += f", slowest server {slow} ({doc.get('slowest_ms', 0.0):.1f} ms)"
    age = now - float(doc.get("t", now))
    if age > stale_after:
        text += f" (no update for {age:.0f} s)"
    return text


class LiveView:
    """Shows the workers' status files of ``folder``; :meth:`tick` from the supervision
    loop, :meth:`close` at the end."""

    def __init__(self, folder: str, workers: int, kind: str, every: float, stream=None):
        self.folder, self.workers, self.kind = folder, workers, kind
        self.every = min(every, TTY_REFRESH_S) if kind == "tty" else every
        self.stream = sys.stderr if stream is None else stream
        self.drawn = 0                 # lines of the block now on the terminal
        self.next = time.monotonic() + (0.5 if kind == "tty" else every)
        if kind == "tty":
            supervise.OUTPUT_HOOKS.append(self.erase)

    def read(self) -> dict[int, dict]:
        docs: dict[int, dict] = {}
        for r in range(self.workers):
            try:
                with open(os.path.join(self.folder, f"worker{r}.live")) as f:
                    doc = json.load(f)
                if isinstance(doc, dict):
                    docs[r] = doc
            except (OSError, ValueError):
                pass
        return docs

    def lines(self) -> list[str]:
        docs, now = self.read(), time.time()
        stale = max(5.0, 3 * self.every)
        return [line(docs.get(r), r, now, stale) for r in range(self.workers)]

    def tick(self) -> None:
        """Redraw (terminal) or print (log) when due."""
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.every
        if self.kind == "tty":
            self.draw(self.lines())
        else:
            for text in self.lines():
                supervise.say(f"INFO {text}")

    def draw(self, lines: list[str]) -> None:
        width = _width(self.stream)
        out = "".join(f"\r\x1b[2Kbpslaunch: {t}"[:width + 5] + "\n" for t in lines)
        with supervise._OUT_LOCK:
            self._wipe()
            try:
                self.stream.write(out)
                self.stream.flush()
            except (OSError, ValueError):
                return
            self.drawn = len(lines)

    def erase(self) -> None:
        """Remove the block (called with the output lock held, before other output); it is
        drawn again below that output shortly after."""
        if self._wipe():
            self.next = min(self.next, time.monotonic() + 0.2)

    def _wipe(self) -> bool:
        if not self.drawn:
            return False
        try:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")    # up to its first line, erase
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.drawn = 0
        return True

    def close(self) -> None:
        if self.kind == "tty":
            with supervise._OUT_LOCK:
                self._wipe()
            if self.erase in supervise.OUTPUT_HOOKS:
                supervise.OUTPUT_HOOKS.remove(self.erase)


def _width(stream) -> int:
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        cols = 0
    return max(20, cols - 1) if cols > 0 else 200     # a new pty may report 0 columns

"""The hang doctor: when a server reports a stall (a round waiting longer than
``BYTEPS_STALL_WARNING_S`` for some ranks' pushes), name what each missing rank is doing
right now: the Python stack of its threads, which the rank sends with its heartbeats while
its step does not advance (byteps/core/api/reporter.py), and the last operation it
completed.  One report per (tensor, round, rank), logged by the scheduler (so bpslaunch
shows it) and kept for the dashboard.
"""
from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("byteps.scheduler")

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # .../byteps/
STACK_WAIT_S = 5.0       # a stall waits this long for the missing rank's stack
FRESH_S = 5.0            # a stack older than this is not "right now"


def where(frames: list, depth: int = 4) -> str:
    """'train.py:41 in stuck_here() <- train.py:88 in main()' (innermost first)."""
    parts = [f"{os.path.basename(f)}:{ln} in {fn}()" for f, ln, fn in reversed(frames)]
    return " <- ".join(parts[:depth]) or "no Python frame"


def user_frame(frames: list) -> list | None:
    """The innermost frame outside the standard library and byteps (the user's code)."""
    for f in reversed(frames):
        path = f[0]
        if path.startswith(_PKG) or ("/lib/python" in path and "site-packages" not in path):
            continue
        return f
    return None


class Doctor:
    """Pending stalls and the reports made (``reports``: newest last, for the page).

    Two triggers: a server's STALL (the tensor, round and missing ranks, exact), and the
    ranks' own reports (inside a host's local reduction no server sees the round): some
    ranks blocked in ``synchronize`` of a tensor for ``warn_s`` while another rank, whose
    step did not advance either, is not inside BytePS at all.  One report per rank and step.
    """

    def __init__(self, warn_s: float = 60.0):
        self.warn_s = warn_s
        self.pending: list[dict] = []    # server stalls waiting for a stack
        self.done: set = set()           # (rank, step) reported
        self.reports: list[dict] = []

    def stall(self, body: dict, now: float) -> None:
        """A server's STALL body (validated here: only the fields used)."""
        tensor, rnd, missing = body.get("tensor"), body.get("round"), body.get("missing")
        age = body.get("age")
        if not (isinstance(tensor, str) and type(rnd) is int and isinstance(missing, list)
                and all(type(r) is int and 0 <= r < 1 << 31 for r in missing[:1024])):
            return
        age = float(age) if isinstance(age, (int, float)) and not isinstance(age, bool) else 0.0
        for r in missing[:1024]:
            if all(p["rank"] != r for p in self.pending):
                self.pending.append({"rank": r, "tensor": tensor[:400], "round": rnd,
                                     "since": now, "age": age})

    def tick(self, now: float, ranks: dict) -> list[dict]:
        """Reports due now; ``ranks``: rank -> {host, pid, state, report, report_t}."""
        made = []
        for p in list(self.pending):
            info = ranks.get(p["rank"], {})
            rep = info.get("report") or {}
            fresh = "stacks" in rep and now - info.get("report_t", 0.0) < FRESH_S
            if not fresh and now - p["since"] < STACK_WAIT_S:
                continue
            self.pending.remove(p)
            key = (p["rank"], rep.get("step"))
            if key in self.done:
                continue
            self.done.add(key)
            made.append(self.report(p["rank"], p["tensor"], p["round"],
                                    p["age"] + now - p["since"], info, rep if fresh else {},
                                    []))
        made += self.from_reports(now, ranks)
        return made

    def from_reports(self, now: float, ranks: dict) -> list[dict]:
        live = {r: i for r, i in ranks.items() if i.get("state") == "running"
                and i.get("report") and now - i.get("report_t", 0.0) < FRESH_S}
        waiting = {r: i["report"] for r, i in live.items()
                   if i["report"].get("waiting_s", 0.0) >= self.warn_s}
        if not waiting:
            return []
        names = [rep["waiting"] for rep in waiting.values()]
        tensor = max(set(names), key=names.count)
        age = max(rep["waiting_s"] for rep in waiting.values())
        made = []
        for r, info in live.items():
            rep = info["report"]
            if r in waiting or "waiting" in rep or "stacks" not in rep or \
                    rep.get("in_step_s", 0.0) < self.warn_s:
                continue
            key = (r, rep.get("step"))
            if key in self.done:
                continue
            self.done.add(key)
            made.append(self.report(r, tensor, None, age, info, rep, sorted(waiting)))
        return made

    def report(self, r: int, tensor: str, rnd: int | None, age: float, info: dict, rep: dict,
               waiters: list) -> dict:
        who = f"rank {r} (host {info.get('host', '?')}, pid {info.get('pid', '?')})"
        at = f" round {rnd}" if rnd is not None else ""
        text = f"{who} has not pushed {tensor!r}{at} for {age:.0f} s"
        if waiters:
            text += f" (rank(s) {', '.join(map(str, waiters))} wait for it)"
        stacks = rep.get("stacks") or []
        main = next((fr for name, fr in stacks if name == "MainThread"), None)
        if main is not None:
            text += f"; its main thread is in {where(main)}"
            uf = user_frame(main)
            if uf is not None and uf is not main[-1]:
                text += f" (your code: {os.path.basename(uf[0])}:{uf[1]} in {uf[2]}())"
        elif info.get("state") not in (None, "running"):
            text += f"; it is {info['state']}"
        else:
            text += "; it sent no stack (its heartbeats carry none: is its engine thread " \
                    "stuck, or the process frozen?)"
        if rep.get("last"):
            text += f"; last completed: {rep['last']!r} at step {rep.get('step', '?')}"
        log.warning("hang doctor: %s", text)
        doc = {"t": time.time(), "rank": r, "tensor": tensor, "round": rnd, "text": text,
               "stacks": stacks}
        self.reports.append(doc)
        del self.reports[:-20]
        return doc

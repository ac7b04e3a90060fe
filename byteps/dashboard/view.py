"""The job as the scheduler sees it, for the dashboard and the hang doctor.

:meth:`JobView.note` runs on the scheduler's thread for every authenticated message (it
only stores a validated report or stall); a daemon thread (:meth:`JobView.run`) reads the
scheduler's membership every ``PERIOD_S``, runs the hang doctor and the straggler
attribution, and publishes one immutable JSON snapshot that the HTTP threads serve.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time

from byteps.dashboard import reports
from byteps.dashboard.doctor import Doctor
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")

PERIOD_S = 0.5
SERIES_RANKS = 32           # more ranks: the plots show their min, median and max
SERIES_POINTS = 600         # time-series points kept (halved when full: the whole job)
STRAGGLER_EVERY_S = 60.0    # how often the same slowest rank is named again in the log
STEADY = 4                  # refreshes (PERIOD_S) a straggler must stand out before named


class JobView:
    def __init__(self, sched, log_stragglers: bool = True):
        self.sched = sched
        self.lock = threading.Lock()
        self.reports: dict[bytes, tuple] = {}       # ident -> (monotonic, clean report)
        self.stalls: collections.deque = collections.deque(maxlen=50)
        self.events: collections.deque = collections.deque(maxlen=200)
        self.series: list = []                      # [t, {rank: [step_ms, MBps]}]
        self.every = 1.0                            # seconds between series points
        self.doctor = Doctor(sched.cfg.stall_warning_s)
        self.known: dict = {}                       # rank -> state last seen (events)
        self.epoch = None
        self.straggler = None
        self.candidate, self.seen = None, 0
        self.said_straggler, self.said_who = 0.0, None
        self.log_stragglers = log_stragglers
        self.snapshot = b"{}"
        self.version = 0
        self.changed = threading.Condition(self.lock)
        self.started = time.time()
        self.stop = threading.Event()
        self.bad = 0
        self.http = None                            # the page's HTTP server (web.py)
        self.stacks: dict[bytes, tuple] = {}        # ident -> (monotonic, last stacks sent)
        self.asked_until = 0.0                      # bpslaunch --stacks: ask until then
        self.server_bytes: dict = {}                # ident -> (t, bytes) of the load window
        self.server_load: dict = {}                 # ident -> MB/s received

    # ------------------------------------------------------------ scheduler thread
    def note(self, ident: bytes, node: dict, hdr) -> None:
        """A message from a registered node (validated by the scheduler)."""
        try:
            if hdr.op == Op.HEARTBEAT and "report" in hdr.body:
                server = ident in self.sched.servers
                rep = (reports.clean_server if server else reports.clean)(hdr.body["report"])
                now = time.monotonic()
                with self.lock:
                    self.reports[ident] = (now, rep)
                    if rep.get("stacks"):
                        self.stacks[ident] = (now, rep["stacks"])
            elif hdr.op == Op.STALL:
                with self.lock:
                    self.stalls.append((time.time(), str(hdr.body.get("text"))[:1000]))
                    self.doctor.stall(hdr.body, time.monotonic())
        except ValueError as exc:
            self.bad += 1
            if self.bad <= 3:
                log.warning("dashboard: ignored a malformed report from node %s: %s",
                            node.get("node_id"), exc)

    def ack(self, ident: bytes) -> dict:
        """The body of a heartbeat's answer: asks a worker for its stacks (--stacks)."""
        if self.asked_until and time.monotonic() < self.asked_until and \
                ident in self.sched.workers:
            return {"stacks": True}
        return {}

    # ------------------------------------------------------------ bpslaunch --stacks
    def all_stacks(self, wait_s: float = 4.0) -> dict:
        """Ask every running worker for its stacks; wait up to ``wait_s`` for them.
        Returns {rank: {host, pid, age_s, stacks}} (stacks None when none came)."""
        asked = time.monotonic()
        self.asked_until = asked + wait_s
        while True:
            now = time.monotonic()
            with self.lock:
                ranks = self.ranks(now)
                idents = {w.get("rank"): i for i, w in list(self.sched.workers.items())}
                got = {r: self.stacks.get(idents.get(r), (0.0, None)) for r in ranks}
            running = [r for r in ranks if ranks[r]["state"] == "running"]
            if all(got[r][0] >= asked for r in running) or now - asked >= wait_s:
                break
            time.sleep(0.1)
        return {r: {"host": ranks[r]["host"], "pid": ranks[r]["pid"],
                    "state": ranks[r]["state"],
                    "age_s": round(now - got[r][0], 1) if got[r][1] else None,
                    "stacks": got[r][1]} for r in sorted(ranks)}

    # ------------------------------------------------------------ view thread
    def run(self) -> None:
        next_point = 0.0
        while not self.stop.wait(PERIOD_S):
            try:
                now = time.monotonic()
                self.refresh(now, now >= next_point)
                if now >= next_point:
                    next_point = now + self.every
            except Exception:         # the dashboard must not end the job
                log.exception("dashboard: refresh failed")

    def ranks(self, now: float) -> dict[int, dict]:
        s = self.sched
        out = {}
        for ident, w in list(s.workers.items()):
            rank = w.get("rank", -1)
            if not isinstance(rank, int) or rank < 0:
                continue
            state = ("exited" if ident in s.exited else "left" if ident in s.left else
                     "unreachable" if w.get("down_since") is not None else "running")
            t, rep = self.reports.get(ident, (0.0, None))
            out[rank] = {"rank": rank, "host": w.get("host_id") or w.get("host"),
                         "pid": w.get("pid"), "node_id": w.get("node_id"), "state": state,
                         "report": rep, "report_t": t,
                         "age_s": round(now - t, 1) if rep else None}
        return out

    def refresh(self, now: float, point: bool) -> None:
        s = self.sched
        with self.lock:
            ranks = self.ranks(now)
            made = self.doctor.tick(now, ranks)
        wall = time.time()
        for doc in made:
            self.events.append((wall, "hang doctor: " + doc["text"]))
        self.membership_events(ranks, wall)
        rows, split = [], {}
        named = {d["rank"] for d in self.doctor.reports if wall - d["t"] < 120}
        for r in sorted(ranks):
            info = ranks[r]
            rep = info.pop("report") or {}
            info.pop("report_t")
            step_ms, wait_ms = rep.get("step_ms"), rep.get("wait_ms")
            compute = None if step_ms is None else max(0.0, step_ms - (wait_ms or 0.0))
            rnd = reports.round_ms(rep)
            if info["state"] == "running" and step_ms and rep.get("step", 0) >= 3:
                split[r] = {"compute_ms": compute, "wait_ms": wait_ms, "round_ms": rnd,
                            "push_ms": rep.get("push_ms")}
            rows.append(dict(info, **{k: v for k, v in rep.items() if k != "stacks"},
                             compute_ms=None if compute is None else round(compute, 3),
                             round_ms=None if rnd is None else round(rnd, 3),
                             stalled=bool(rep.get("stacks")),
                             stuck=r in named and bool(rep.get("stacks"))))
        found = reports.stragglers(split)
        # named once the same rank and kind stand out for STEADY evaluations in a row
        same = found and self.candidate and (found["rank"], found["kind"]) == \
            (self.candidate["rank"], self.candidate["kind"])
        self.seen = self.seen + 1 if same else (1 if found else 0)
        self.candidate = found
        self.straggler = found if self.seen >= STEADY else None
        who = self.straggler and (self.straggler["rank"], self.straggler["kind"])
        if who and self.log_stragglers and (who != self.said_who or
                                            now - self.said_straggler > STRAGGLER_EVERY_S):
            self.said_straggler, self.said_who = now, who     # a new one at once, else rarely
            log.warning("straggler: %s", self.straggler["text"])
        if point and rows:
            self.series.append([round(wall - self.started, 1), _point(rows)])
            if len(self.series) > SERIES_POINTS:
                self.series = self.series[::2]
                self.every *= 2
        doc = {"job": s.cfg.job_id, "epoch": s.epoch, "formed": s.formed, "t": wall,
               "uptime_s": round(wall - self.started, 1), "workers": rows,
               "servers": self.servers(rows), "config": self.config(rows),
               "straggler": self.straggler, "warnings": self.warnings(rows, wall),
               "doctor": self.doctor.reports[-5:], "events": [
                   [round(t, 3), text] for t, text in list(self.events)[-50:]],
               "series": self.series}
        data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        with self.changed:
            self.snapshot = data
            self.version += 1
            self.changed.notify_all()

    def membership_events(self, ranks: dict, wall: float) -> None:
        s = self.sched
        if s.epoch != self.epoch and s.formed:
            text = (f"membership epoch {s.epoch}: {len(s.workers)} worker(s), "
                    f"{len(s.servers)} server(s)")
            self.events.append((wall, text))
            self.epoch = s.epoch
        for r, info in ranks.items():
            before = self.known.get(r)
            if before != info["state"]:
                if before is not None or info["state"] != "running":
                    self.events.append((wall, f"rank {r} (host {info['host']}): {info['state']}"))
                self.known[r] = info["state"]
        for r in list(self.known):
            if r not in ranks:
                self.events.append((wall, f"rank {r}: gone from the job"))
                del self.known[r]

    def servers(self, rows: list) -> list:
        out = []
        s = self.sched
        for i, (ident, n) in enumerate(list(s.servers.items())):
            lat = [r["srv_ms"][i] for r in rows if len(r.get("srv_ms") or []) > i
                   and r["srv_ms"][i] >= 0]
            state = ("lost (its backup serves its keys)" if n.get("lost") else
                     "exited" if ident in s.exited else
                     "unreachable" if n.get("down_since") is not None else "running")
            t, rep = self.reports.get(ident, (0.0, {}))
            t0, b0 = self.server_bytes.get(ident, (t, rep.get("bytes", 0)))
            if t - t0 >= 2.0 or ident not in self.server_bytes:   # received MB/s: its load
                self.server_load[ident] = (rep.get("bytes", 0) - b0) / 1e6 / (t - t0) \
                    if t > t0 else None
                self.server_bytes[ident] = (t, rep.get("bytes", 0))
            load = self.server_load.get(ident)
            out.append({"index": i, "node_id": n.get("node_id"), "host": n.get("host"),
                        "address": n.get("address"), "state": state,
                        "replicas": s.cfg.server_replicas, **rep,
                        "MBps": None if load is None else round(load, 3),
                        "round_ms": round(sum(lat) / len(lat), 3) if lat else None})
        return out

    def config(self, rows: list) -> dict:
        first = next((r for r in rows if r.get("mode")), {})
        return {"mode": first.get("mode"), "compression": first.get("comp"),
                "ratio": first.get("ratio"), "autotune": first.get("tune"),
                "num_worker_hosts": self.sched.cfg.num_worker,
                "num_server": self.sched.cfg.num_server}

    def warnings(self, rows: list, wall: float) -> list:
        out = [f"stall: {text}" for t, text in self.stalls if wall - t < 120]
        out += [f"rank {r['rank']} (host {r['host']}) {r['state']}" for r in rows
                if r["state"] != "running"]
        if self.straggler:
            out.append(f"straggler ({self.straggler['kind']}): {self.straggler['text']}")
        return out

    def wait_change(self, version: int, timeout: float) -> tuple[int, bytes]:
        """The next snapshot after ``version`` (or the current one after ``timeout``)."""
        with self.changed:
            if self.version == version:
                self.changed.wait(timeout)
            return self.version, self.snapshot


def _point(rows: list) -> dict:
    """One time-series point: [step ms, MB/s] per rank, or, beyond SERIES_RANKS ranks, their
    min, median and max (the snapshot stays small for a large job)."""
    if len(rows) <= SERIES_RANKS:
        return {r["rank"]: [r.get("step_ms"), r.get("MBps")] for r in rows}
    out = {}
    cols = [sorted(v for v in (r.get(k) for r in rows) if isinstance(v, (int, float)))
            for k in ("step_ms", "MBps")]
    for name, pick in (("min", lambda c: c[0]), ("median", lambda c: c[len(c) // 2]),
                       ("max", lambda c: c[-1])):
        out[name] = [pick(c) if c else None for c in cols]
    return out

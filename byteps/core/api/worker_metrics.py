"""The worker's own numbers: its Prometheus metrics (registered with
:func:`byteps.common.metrics.register`, served by :mod:`byteps.common.metrics`) and the
``worker<rank>.live`` status file of bpslaunch's live view (docs/metrics.md).

Both read the worker's state through the function :func:`start` is given (the api's
current state, None between ``shutdown()`` and ``init()``), never a module's private name.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from byteps.common import metrics
from byteps.common.metrics import round_histogram

log = logging.getLogger("byteps.metrics")
_WRITER: list = []           # the one StatusWriter of this process


def start(cfg, rank: int, state: Callable[[], object]) -> None:
    """After ``init()``: register this worker's metrics and serve them (when
    BYTEPS_METRICS_PORT is set), and start the live status (when bpslaunch asked for it).
    ``state()`` is the api's current state (or None)."""
    def families(core):
        st = state()
        return worker_families(core, st) if st is not None else []
    metrics.register("worker", families)
    metrics.serve(f"worker rank {rank}", cfg, "worker", rank)
    folder = os.environ.get("BPSLAUNCH_SUMMARY_DIR")
    raw = os.environ.get("BPSLAUNCH_LIVE_S")
    if _WRITER or not folder or not raw or not os.path.isdir(folder):
        return
    try:
        interval = max(0.05, float(raw))
    except ValueError:
        return
    _WRITER.append(StatusWriter(folder, interval, state))


def worker_families(core, st) -> list:
    """Metrics of a worker from its api state (engine, step counter, scheduler link)."""
    eng = st.engine
    if eng is None:
        return []
    now = time.monotonic()
    lab = ["rank"]
    r = [str(st.rank)]

    def gauge(name, doc, value):
        g = core.GaugeMetricFamily(name, doc, labels=lab)
        g.add_metric(r, value)
        return g

    def counter(name, doc, value):
        c = core.CounterMetricFamily(name, doc, labels=lab)
        c.add_metric(r, value)
        return c
    pushed = sum(b[0] for b in list(eng.bytes.values()))
    pushed_wire = sum(b[1] for b in list(eng.bytes.values()))
    try:
        inflight = list(eng.inflight.values())
    except RuntimeError:           # changed during the copy: next scrape
        inflight = []
    sent = [getattr(t, "sent_at", None) for t in inflight]     # None: not sent yet
    oldest = max((now - s for s in sent if s), default=0.0)
    rounds = eng.rounds
    per = core.CounterMetricFamily("byteps_worker_rounds", "partition rounds completed, per "
                                   "server", labels=["rank", "server"])
    for i, n in enumerate(list(rounds.n)):
        per.add_metric([r[0], str(i)], n)
    return [
        counter("byteps_worker_pushed_bytes", "raw bytes pushed (resends included)", pushed),
        counter("byteps_worker_pushed_wire_bytes", "bytes pushed after compression",
                pushed_wire),
        counter("byteps_worker_pulled_bytes", "raw bytes of the results pulled (each "
                "completed partition once)", eng.speed.total_bytes),
        counter("byteps_worker_push_pulls", "push_pull operations completed (whole tensors)",
                eng.speed.total_ops),
        per,
        round_histogram(core, "byteps_worker_round_seconds", "partition handed to the "
                        "socket -> its result received, per server", rounds, r[0]),
        gauge("byteps_worker_push_pull_mbps", "push_pull throughput over the last 10 s "
              "(MB/s, 1 MB = 1e6 bytes)", eng.speed.get(now)[1]),
        gauge("byteps_worker_step", "training steps completed", st.steps.n),
        gauge("byteps_worker_queue_depth", "partitions waiting for the credit window",
              len(eng.heap) + len(eng.pending)),
        gauge("byteps_worker_inflight_partitions", "partitions sent, result not yet back",
              len(inflight)),
        gauge("byteps_worker_inflight_bytes", "bytes within the credit window",
              eng.inflight_bytes),
        gauge("byteps_worker_oldest_inflight_seconds", "age of the oldest partition in "
              "flight (a stall shows here first)", oldest),
        gauge("byteps_worker_heartbeat_age_seconds", "seconds since the last message from "
              "the scheduler", now - st.link.last_heard),
        counter("byteps_worker_resends", "partitions sent again (late answers)", eng.resends),
    ]


class StatusWriter:
    """Writes this worker's ``worker<rank>.live`` for bpslaunch's live view, every
    ``interval`` seconds, from a daemon thread (one per process; follows re-inits)."""

    def __init__(self, folder: str, interval: float, state: Callable[[], object]):
        self.folder, self.interval, self.state = folder, interval, state
        self.prev: tuple | None = None          # (engine id, rounds, sums) of the last write
        self.thread = threading.Thread(target=self.run, name="byteps-live-status",
                                       daemon=True)
        self.thread.start()

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            st = self.state()
            if st is None or st.engine is None:
                continue
            try:
                self.write(st)
            except Exception as exc:   # noqa: BLE001 - never break training for a status line
                log.debug("cannot write the live status: %r", exc)

    def status(self, st) -> dict:
        eng = st.engine
        n, sums = eng.rounds.snapshot()
        prev = self.prev if self.prev and self.prev[0] == id(eng) else (id(eng), [0] * len(n),
                                                                        [0.0] * len(n))
        self.prev = (id(eng), n, sums)
        dn = [a - b for a, b in zip(n, prev[1])]
        ds = [a - b for a, b in zip(sums, prev[2])]
        means = [s / k if k else None for s, k in zip(ds, dn)]
        slow = max((i for i in range(len(means)) if means[i] is not None),
                   key=lambda i: means[i], default=None)
        recent = sum(ds) / sum(dn) if sum(dn) else None
        return {"rank": st.rank, "host": st.cfg.host_id, "pid": os.getpid(), "t": time.time(),
                "step": st.steps.n, "MBps": round(eng.speed.get()[1], 3),
                "bytes": eng.speed.total_bytes, "push_pulls": eng.speed.total_ops,
                "round_ms": None if recent is None else round(recent * 1e3, 3),
                "last_round_ms": round(eng.rounds.last * 1e3, 3),
                "slowest_server": slow,
                "slowest_ms": None if slow is None else round(means[slow] * 1e3, 3),
                "inflight": len(eng.inflight), "queued": len(eng.heap) + len(eng.pending),
                **eng.comp.totals()}     # raw and wire (after compression) bytes

    def write(self, st) -> None:
        path = os.path.join(self.folder, f"worker{st.rank}.live")
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.status(st), f)
        os.replace(tmp, path)

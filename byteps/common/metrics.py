"""Live numbers of every role: Prometheus metrics and the worker's status for bpslaunch.

* ``BYTEPS_METRICS_PORT=P`` serves Prometheus metrics over HTTP
  (``prometheus-client``, the ``metrics`` extra) from every process of a job:
  the scheduler on ``P``, server ``i`` on ``P + 1 + i``, worker rank ``r`` on
  ``P + 1 + num_servers + r``.  ``P = 0`` gives every process an ephemeral port,
  which it logs.  The values are read from counters the processes keep anyway,
  at scrape time (:class:`_Collector`); the only hot-path addition is
  :meth:`RoundLatency.observe`, a few integer operations per partition.
* Under ``bpslaunch --standalone`` with the live view on (``BPSLAUNCH_LIVE_S``), a
  worker writes ``worker<rank>.live`` (JSON) into the launcher's summary folder
  every ``BPSLAUNCH_LIVE_S`` seconds (:class:`StatusWriter`);
  :mod:`byteps.launcher.liveview` shows it.

See docs/metrics.md.
"""
from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("byteps.metrics")
# upper bounds (seconds) of the round-latency histogram; the last bucket is +Inf
ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, 30.0)
INSTALL_HINT = "pip install 'byteps-ps[metrics]' (or pip install prometheus-client)"
_STARTED: dict[str, int] = {}      # role label -> port, one HTTP server per process and role
_WARNED: list[str] = []


class RoundLatency:
    """Round latency per server (a partition handed to the socket -> its result back).

    Written by the worker's engine thread only; read by the scrape and the status
    writer (plain ints and floats: a read may be one partition behind, never torn).
    """

    def __init__(self, nservers: int):
        self.counts = [[0] * (len(ROUND_BUCKETS) + 1) for _ in range(nservers)]
        self.sums = [0.0] * nservers
        self.n = [0] * nservers
        self.last = 0.0

    def observe(self, server: int, seconds: float) -> None:
        """One partition's round with ``server`` took ``seconds``."""
        self.counts[server][bisect.bisect_left(ROUND_BUCKETS, seconds)] += 1
        self.sums[server] += seconds
        self.n[server] += 1
        self.last = seconds

    def snapshot(self) -> tuple[list[int], list[float]]:
        """(rounds per server, total seconds per server) right now."""
        return list(self.n), list(self.sums)


# ---------------------------------------------------------------- configuration
def metrics_port(env: Mapping[str, str]) -> int | None:
    """``BYTEPS_METRICS_PORT`` as an int (None when unset); raises ConfigError if malformed."""
    from byteps.common.config import ConfigError
    raw = (env.get("BYTEPS_METRICS_PORT") or "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535 - 1:
        raise ConfigError(f"BYTEPS_METRICS_PORT={raw!r} is not a port number (0..65534, e.g. "
                          f"9400; 0: an ephemeral port per process)")
    return port


def available() -> bool:
    """Whether prometheus-client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def check_env(env: Mapping[str, str]) -> str | None:
    """For bpslaunch: validate BYTEPS_METRICS_PORT (ConfigError) and return a warning
    when it is set but prometheus-client is missing."""
    if metrics_port(env) is not None and not available():
        return (f"BYTEPS_METRICS_PORT is set but prometheus-client is not installed: no "
                f"metrics; {INSTALL_HINT}")
    return None


def port_for(base: int, role: str, index: int, num_servers: int) -> int:
    """The port of one process: scheduler ``base``, server i ``base+1+i``, worker rank r
    ``base+1+num_servers+r`` (0 stays 0: ephemeral)."""
    if base == 0:
        return 0
    if role == "scheduler":
        return base
    if role == "server":
        return base + 1 + index
    return base + 1 + num_servers + index


# ---------------------------------------------------------------- HTTP endpoint
class _Collector:
    """A prometheus-client collector that reads a role's counters at scrape time."""

    def __init__(self, read: Callable[[], list]):
        self.read = read

    def collect(self):
        try:
            yield from self.read()
        except Exception as exc:     # noqa: BLE001 - a scrape must not break the process
            log.debug("metrics collection failed: %r", exc)

    def describe(self):
        return []


def serve(what: str, cfg, role: str, index: int, families: Callable[[object], list]) -> int | None:
    """Serve ``families(prometheus_client.core)`` for this process when BYTEPS_METRICS_PORT
    is set; returns the port (None: off or failed).  Never raises."""
    try:
        base = metrics_port(os.environ)
    except ValueError as exc:
        _warn_once(str(exc))
        return None
    if base is None:
        return None
    if role in _STARTED:       # init() after shutdown(): the collector reads the new state
        return _STARTED[role]
    try:
        import prometheus_client
        from prometheus_client import core
    except ImportError:
        _warn_once(f"BYTEPS_METRICS_PORT is set but prometheus-client is not installed: no "
                   f"metrics; {INSTALL_HINT}")
        return None
    port = port_for(base, role, index, cfg.num_server or 0)
    host = os.environ.get("BYTEPS_METRICS_HOST") or _host(cfg, role)
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: families(core)))
    try:
        server, _ = prometheus_client.start_http_server(port, addr=host, registry=registry)
        port = server.server_port
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot serve metrics on %s:%d (BYTEPS_METRICS_PORT=%d): %s", what,
                    host, port, base, exc)
        return None
    _STARTED[role] = port
    text = "%s: Prometheus metrics at http://%s:%d/metrics"
    (log.warning if base == 0 else log.info)(text + (" (ephemeral port)" if base == 0 else ""),
                                             what, host, port)
    return port


def _host(cfg, role: str) -> str:
    if role == "scheduler":
        from byteps.common.config import scheduler_listen_host
        return scheduler_listen_host(cfg.root_uri)
    return cfg.node_host or "127.0.0.1"


def _warn_once(text: str) -> None:
    if text in _WARNED:
        return
    _WARNED.append(text)
    from byteps.common.config import NAMES_CHECKED
    # under bpslaunch the launcher said it once for the whole job
    (log.debug if os.environ.get(NAMES_CHECKED) else log.warning)("%s", text)


def _histogram(core, name: str, doc: str, rounds: RoundLatency, rank: str):
    h = core.HistogramMetricFamily(name, doc, labels=["rank", "server"])
    for i, counts in enumerate(rounds.counts):
        counts = list(counts)
        acc, buckets = 0, []
        for bound, c in zip(ROUND_BUCKETS + (float("inf"),), counts):
            acc += c
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        h.add_metric([rank, str(i)], buckets, rounds.sums[i])
    return h


# ---------------------------------------------------------------- the roles' numbers
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
        _histogram(core, "byteps_worker_round_seconds", "partition handed to the socket -> "
                   "its result received, per server", rounds, r[0]),
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


def server_families(core, srv) -> list:
    """Metrics of a server (byteps.server.Server)."""
    from byteps.server import store
    now = time.monotonic()

    def one(kind, name, doc, value):
        m = kind(name, doc)
        m.add_metric([], value)
        return m
    pending = sum(1 for s in list(srv.slots.values()) for rs in list(s.rounds.values())
                  if rs.result is None and rs.ranks)
    return [
        one(core.CounterMetricFamily, "byteps_server_received_bytes",
            "payload bytes of the pushes received", srv.bytes_received),
        one(core.CounterMetricFamily, "byteps_server_received_wire_bytes",
            "bytes of every DATA message received (headers too)", srv.wire_received),
        one(core.CounterMetricFamily, "byteps_server_rounds",
            "partition rounds summed (every worker's push in)", store.ROUNDS_DONE[0]),
        one(core.CounterMetricFamily, "byteps_server_stall_reports",
            "stall reports sent to the scheduler (BYTEPS_STALL_WARNING_S)",
            getattr(srv, "stall_reports", 0)),
        one(core.GaugeMetricFamily, "byteps_server_open_rounds",
            "rounds that have some pushes but not all (waiting for workers)", pending),
        one(core.GaugeMetricFamily, "byteps_server_queue_depth",
            "partitions queued for the summation threads",
            sum(q.qsize() for q in srv.queues)),
        one(core.GaugeMetricFamily, "byteps_server_workers", "workers in the job",
            srv.nworkers),
        one(core.GaugeMetricFamily, "byteps_server_keys",
            "tensor keys declared and held (autotune's other partition sizes are freed)",
            sum(1 for d in list(srv.decls.values()) if "shape" in d)),
        one(core.CounterMetricFamily, "byteps_server_keys_freed",
            "tensor keys freed once every worker was done with them (FREE)",
            getattr(srv, "keys_freed", 0)),
        one(core.GaugeMetricFamily, "byteps_server_heartbeat_age_seconds",
            "seconds since the last message from the scheduler", now - srv.link.last_heard),
    ]


def scheduler_families(core, sched) -> list:
    """Metrics of the scheduler (byteps.scheduler.Scheduler)."""
    now = time.monotonic()
    nodes = core.GaugeMetricFamily("byteps_scheduler_nodes", "registered nodes",
                                   labels=["role"])
    nodes.add_metric(["server"], len(sched.servers))
    nodes.add_metric(["worker"], len(sched.workers))
    ages = core.GaugeMetricFamily("byteps_scheduler_heartbeat_age_seconds",
                                  "seconds since the last message from each node",
                                  labels=["role", "node_id", "rank"])
    for role, group in (("server", sched.servers), ("worker", sched.workers)):
        for n in list(group.values()):
            if "last_seen" in n:
                ages.add_metric([role, str(n.get("node_id", -1)), str(n.get("rank", -1))],
                                now - n["last_seen"])
    stalls = core.CounterMetricFamily("byteps_scheduler_stall_reports",
                                      "stall reports received from servers")
    stalls.add_metric([], getattr(sched, "stall_reports", 0))
    epoch = core.GaugeMetricFamily("byteps_scheduler_epoch", "membership epoch")
    epoch.add_metric([], sched.epoch)
    return [nodes, ages, stalls, epoch]


def serve_worker(cfg, rank: int) -> int | None:
    """The worker's endpoint; reads ``byteps.core.api``'s current state at each scrape."""
    from byteps.core import api

    def families(core):
        st = api._STATE
        return worker_families(core, st) if st is not None else []
    return serve(f"worker rank {rank}", cfg, "worker", rank, families)


def serve_server(srv, index: int) -> int | None:
    return serve(f"server {index}", srv.cfg, "server", index,
                 lambda core: server_families(core, srv))


def serve_scheduler(sched) -> int | None:
    return serve("scheduler", sched.cfg, "scheduler", 0,
                 lambda core: scheduler_families(core, sched))


# ---------------------------------------------------------------- bpslaunch's live view
class StatusWriter:
    """Writes this worker's ``worker<rank>.live`` for bpslaunch's live view, every
    ``interval`` seconds, from a daemon thread (one per process; follows re-inits)."""

    def __init__(self, folder: str, interval: float):
        self.folder, self.interval = folder, interval
        self.prev: tuple | None = None          # (engine id, rounds, sums) of the last write
        self.thread = threading.Thread(target=self.run, name="byteps-live-status",
                                       daemon=True)
        self.thread.start()

    def run(self) -> None:
        from byteps.core import api
        while True:
            time.sleep(self.interval)
            st = api._STATE
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
                "inflight": len(eng.inflight), "queued": len(eng.heap) + len(eng.pending)}

    def write(self, st) -> None:
        path = os.path.join(self.folder, f"worker{st.rank}.live")
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.status(st), f)
        os.replace(tmp, path)


_WRITER: list[StatusWriter] = []


def start_worker(cfg, rank: int) -> None:
    """After ``init()``: the metrics endpoint and the live status (each when asked for)."""
    serve_worker(cfg, rank)
    folder = os.environ.get("BPSLAUNCH_SUMMARY_DIR")
    raw = os.environ.get("BPSLAUNCH_LIVE_S")
    if _WRITER or not folder or not raw or not os.path.isdir(folder):
        return
    try:
        interval = max(0.05, float(raw))
    except ValueError:
        return
    _WRITER.append(StatusWriter(folder, interval))

"""Live numbers of every role: Prometheus metrics and the worker's status for bpslaunch.

* ``BYTEPS_METRICS_PORT=P`` serves Prometheus metrics over HTTP
  (``prometheus-client``, the ``metrics`` extra) from every process of a job:
  the scheduler on ``P``, server ``i`` on ``P + 1 + i``, worker rank ``r`` on
  ``P + 1 + num_servers + r``.  ``P = 0`` gives every process an ephemeral port,
  which it logs.  The values are read from counters the processes keep anyway,
  at scrape time (:class:`_Collector`); the only hot-path addition is
  :meth:`RoundLatency.observe`, a few integer operations per partition.
* **Each role registers its own metrics** (:func:`register`): the worker
  (:mod:`byteps.core.api.worker_metrics`), the server (:mod:`byteps.server.metrics`) and the
  scheduler (:mod:`byteps.scheduler.metrics`) know their own state; this module only
  serves what was registered and imports none of them.
* Under ``bpslaunch --standalone`` with the live view on (``BPSLAUNCH_LIVE_S``), a
  worker writes ``worker<rank>.live`` (JSON) into the launcher's summary folder
  (:class:`byteps.core.api.worker_metrics.StatusWriter`); :mod:`byteps.launcher.liveview`
  shows it.

See docs/metrics.md.
"""
from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Mapping

log = logging.getLogger("byteps.metrics")
# upper bounds (seconds) of the round-latency histogram; the last bucket is +Inf
ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, 30.0)
INSTALL_HINT = "pip install 'byteps-ps[metrics]' (or pip install prometheus-client)"
_STARTED: dict[str, int] = {}      # role label -> port, one HTTP server per process and role
_FAMILIES: dict[str, Callable[[object], list]] = {}   # role label -> its registered families
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
        self.push_n = [0] * nservers         # pushes acknowledged (the upload alone)
        self.push_sums = [0.0] * nservers

    def observe(self, server: int, seconds: float) -> None:
        """One partition's round with ``server`` took ``seconds``."""
        self.counts[server][bisect.bisect_left(ROUND_BUCKETS, seconds)] += 1
        self.sums[server] += seconds
        self.n[server] += 1
        self.last = seconds

    def pushed(self, server: int, seconds: float) -> None:
        """A push reached ``server`` (its ACK came back) ``seconds`` after it was handed to
        the socket: the upload, without waiting for the other ranks (the dashboard's
        network straggler)."""
        self.push_sums[server] += seconds
        self.push_n[server] += 1

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


# ---------------------------------------------------------------- the registry
def register(role: str, families: Callable[[object], list]) -> None:
    """A role's own metrics: ``families(prometheus_client.core)`` returns its metric
    families, called at each scrape.  Registering a role again replaces its function
    (``init()`` after ``shutdown()`` reports the new state through the same endpoint)."""
    _FAMILIES[role] = families


def collect(role: str, core) -> list:
    """What a scrape of ``role``'s endpoint returns now (nothing when none registered)."""
    families = _FAMILIES.get(role)
    return list(families(core)) if families is not None else []


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


def serve(what: str, cfg, role: str, index: int) -> int | None:
    """Serve the metrics registered for ``role`` (:func:`register`) for this process when
    BYTEPS_METRICS_PORT is set; returns the port (None: off or failed).  Never raises."""
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
    registry.register(_Collector(lambda: collect(role, core)))
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


def round_histogram(core, name: str, doc: str, rounds: RoundLatency, rank: str):
    """A Prometheus histogram family of ``rounds`` (one series per server)."""
    h = core.HistogramMetricFamily(name, doc, labels=["rank", "server"])
    for i, counts in enumerate(rounds.counts):
        counts = list(counts)
        acc, buckets = 0, []
        for bound, c in zip(ROUND_BUCKETS + (float("inf"),), counts):
            acc += c
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        h.add_metric([rank, str(i)], buckets, rounds.sums[i])
    return h

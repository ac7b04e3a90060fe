"""The server's own Prometheus metrics, registered with :func:`byteps.common.metrics.register`
and served by :mod:`byteps.common.metrics` (docs/metrics.md)."""
from __future__ import annotations

import time

from byteps.common import metrics
from byteps.server import store
from byteps.server.report import report


def serve_server(srv, index: int) -> int | None:
    """Register server ``index``'s metrics (``srv``: :class:`byteps.server.Server`) and serve
    them when BYTEPS_METRICS_PORT is set."""
    metrics.register("server", lambda core: server_families(core, srv))
    srv.link.beat = lambda: report(srv)     # heartbeats carry it (byteps/dashboard)
    return metrics.serve(f"server {index}", srv.cfg, "server", index)


def server_families(core, srv) -> list:
    """Metrics of a server (byteps.server.Server)."""
    now = time.monotonic()

    def one(kind, name, doc, value):
        m = kind(name, doc)
        m.add_metric([], value)
        return m
    pending = sum(1 for s in list(srv.slots.values()) for rs in list(s.rounds.values())
                  if rs.result is None and rs.ranks)
    return [
        one(core.CounterMetricFamily, "byteps_server_received_bytes",
            "payload bytes of the pushes received", srv.records.bytes_received),
        one(core.CounterMetricFamily, "byteps_server_received_wire_bytes",
            "bytes of every DATA message received (headers too)",
            srv.records.wire_received),
        one(core.CounterMetricFamily, "byteps_server_rounds",
            "partition rounds summed (every worker's push in)", store.ROUNDS_DONE[0]),
        one(core.CounterMetricFamily, "byteps_server_stall_reports",
            "stall reports sent to the scheduler (BYTEPS_STALL_WARNING_S)",
            srv.stalls.sent),
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
            srv.retire.keys_freed),
        one(core.GaugeMetricFamily, "byteps_server_heartbeat_age_seconds",
            "seconds since the last message from the scheduler", now - srv.link.last_heard),
    ]

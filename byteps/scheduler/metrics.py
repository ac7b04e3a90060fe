"""The scheduler's own Prometheus metrics, registered with
:func:`byteps.common.metrics.register` and served by :mod:`byteps.common.metrics`
(docs/metrics.md)."""
from __future__ import annotations

import time

from byteps.common import metrics


def serve_scheduler(sched) -> int | None:
    """Register the scheduler's metrics (``sched``: :class:`byteps.scheduler.Scheduler`) and
    serve them when BYTEPS_METRICS_PORT is set; attach the dashboard (byteps/dashboard)."""
    metrics.register("scheduler", lambda core: scheduler_families(core, sched))
    from byteps import dashboard  # the hang doctor; the page (BYTEPS_DASHBOARD_PORT)
    dashboard.start(sched)
    return metrics.serve("scheduler", sched.cfg, "scheduler", 0)


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

"""The live dashboard, the hang doctor and straggler attribution, on the scheduler's side
(docs/dashboard.md).

:func:`start` is called once by the scheduler (``byteps.scheduler.metrics``): it always
keeps a :class:`~byteps.dashboard.view.JobView` (the hang doctor and the straggler lines
in the scheduler's log need no port), and with ``BYTEPS_DASHBOARD_PORT`` it serves the page
on the job's own address.  This package imports neither the worker (byteps.core) nor the
server: workers' numbers arrive with their heartbeats, validated field by field.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading

log = logging.getLogger("byteps.scheduler")


def token(secret: str | None) -> str | None:
    """The dashboard token of a job secret (None without a secret): an HMAC, so the page's
    URL never reveals the secret that authenticates the job's messages."""
    if not secret:
        return None
    return hmac.new(secret.encode(), b"byteps-dashboard-v1", hashlib.sha256).hexdigest()[:32]


def url(host: str, port: int, secret: str | None) -> str:
    """The ready URL of a job's dashboard (with its token when the job has a secret)."""
    tok = token(secret)
    return f"http://{host}:{port}/" + (f"?token={tok}" if tok else "")


def start(sched):
    """Attach a JobView to ``sched`` (its ``view``) and serve the page when
    BYTEPS_DASHBOARD_PORT is set; returns the HTTP port (None: no page).  Never raises."""
    from byteps.common import variables
    from byteps.common.config import ConfigError, scheduler_listen_host
    from byteps.dashboard.view import JobView
    try:
        port = variables.value("BYTEPS_DASHBOARD_PORT")
    except ConfigError as exc:
        log.warning("dashboard off: %s", exc)
        port = None
    view = JobView(sched)
    sched.view = view
    threading.Thread(target=view.run, name="byteps-dashboard-view", daemon=True).start()
    if port is None:
        return None
    from byteps.dashboard.web import serve
    host = scheduler_listen_host(sched.cfg.root_uri)
    try:
        server = serve(view, host, port, token(sched.cfg.job_secret))
    except OSError as exc:
        log.warning("dashboard: cannot listen on %s:%d (BYTEPS_DASHBOARD_PORT): %s", host,
                    port, exc)
        return None
    view.http = server
    real = server.server_address[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    # bpslaunch --standalone printed the URL already; elsewhere this line is where it is
    said = os.environ.get("BPSLAUNCH_DASHBOARD_SAID") == "1"
    (log.info if said else log.warning)("dashboard at %s", url(shown, real,
                                                               sched.cfg.job_secret))
    return real

"""The dashboard's HTTP side: the stdlib's ThreadingHTTPServer on a daemon thread.

Read-only: GET ``/`` (the page), ``/api/status`` (the latest snapshot, JSON),
``/api/events`` (server-sent events: a snapshot whenever it changes) and ``/api/stacks``
(every worker's stacks now: the workers are asked through the heartbeat answers; for
``bpslaunch --stacks``).  Nothing a request
carries is executed or stored; with a job secret every request needs the token derived from
it (``?token=``), compared in constant time.
"""
from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from byteps.dashboard.page import PAGE

log = logging.getLogger("byteps.scheduler")
MAX_STREAMS = 16            # concurrent /api/events connections
STREAM_S = 600.0            # a stream ends after this long; the page reconnects


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(view, host: str, port: int, token: str | None):
    """Start serving ``view`` (a JobView) on ``host:port``; returns the HTTP server."""
    streams = threading.BoundedSemaphore(MAX_STREAMS)

    class Handler(BaseHTTPRequestHandler):
        server_version = "byteps-dashboard"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):     # no line per request on the scheduler's log
            log.debug("dashboard: " + fmt, *args)

        def do_GET(self):                       # http.server's name
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if token is not None:
                given = (query.get("token") or [""])[0]
                if not hmac.compare_digest(given.encode(), token.encode()):
                    return self.reply(403, b"this job's dashboard needs its token: open the "
                                           b"URL that bpslaunch (or the scheduler's log) "
                                           b"printed, ending in ?token=...\n", "text/plain")
            if url.path in ("/", "/index.html"):
                self.reply(200, PAGE.encode(), "text/html; charset=utf-8")
            elif url.path == "/api/status":
                self.reply(200, view.snapshot, "application/json")
            elif url.path == "/api/stacks":       # every rank's stacks now (--stacks)
                data = json.dumps(view.all_stacks(), separators=(",", ":")).encode()
                self.reply(200, data, "application/json")
            elif url.path == "/api/events":
                self.events()
            else:
                self.reply(404, b"not found\n", "text/plain")

        def reply(self, code: int, data: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy",
                             "default-src 'self'; script-src 'unsafe-inline'; "
                             "style-src 'unsafe-inline'")
            self.end_headers()
            self.wfile.write(data)

        def events(self) -> None:
            if not streams.acquire(blocking=False):
                return self.reply(503, b"too many dashboard streams\n", "text/plain")
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-store")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                version, end = -1, time.monotonic() + STREAM_S
                while time.monotonic() < end and not view.stop.is_set():
                    version, data = view.wait_change(version, 2.0)
                    self.wfile.write(b"data: " + data + b"\n\n")
                    self.wfile.flush()
            except (OSError, ValueError):
                pass                            # the page went away
            finally:
                streams.release()

    server = _Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="byteps-dashboard-http",
                     daemon=True).start()
    return server

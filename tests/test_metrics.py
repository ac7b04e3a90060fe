"""Issue 16 item 15: Prometheus metrics (BYTEPS_METRICS_PORT) and bpslaunch's live view."""
from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import BPSLAUNCH_CLI, ROOT, SCRIPTS, job_env, on_terminal

from byteps.common import metrics
from byteps.common.config import ConfigError
from byteps.launcher import liveview

pytestmark = pytest.mark.timeout(120)
BPSLAUNCH = BPSLAUNCH_CLI
JOB = [sys.executable, str(SCRIPTS / "metrics_job.py")]


# ---------------------------------------------------------------- pure logic
def test_round_latency_histogram_and_ports():
    r = metrics.RoundLatency(2)
    for s in (0.0004, 0.003, 0.003, 40.0):
        r.observe(1, s)
    assert r.n == [0, 4] and r.counts[1][0] == 1 and r.counts[1][-1] == 1
    assert sum(r.counts[1]) == 4 and abs(r.sums[1] - 40.0064) < 1e-9
    assert metrics.port_for(9400, "scheduler", 0, 2) == 9400
    assert metrics.port_for(9400, "server", 1, 2) == 9402
    assert metrics.port_for(9400, "worker", 3, 2) == 9406
    assert metrics.port_for(0, "worker", 3, 2) == 0
    assert metrics.metrics_port({}) is None
    with pytest.raises(ConfigError, match="BYTEPS_METRICS_PORT"):
        metrics.metrics_port({"BYTEPS_METRICS_PORT": "http"})


def test_roles_register_their_own_metrics(monkeypatch):
    """common.metrics serves only what a role registered; registering again replaces it
    (init() after shutdown()), and it imports no role to find the numbers."""
    monkeypatch.setattr(metrics, "_FAMILIES", {})
    assert metrics.collect("worker", None) == []
    metrics.register("worker", lambda core: [("one", core)])
    assert metrics.collect("worker", "C") == [("one", "C")]
    metrics.register("worker", lambda core: [("two", core)])
    assert metrics.collect("worker", "C") == [("two", "C")]
    assert metrics.collect("server", "C") == []
    monkeypatch.delenv("BYTEPS_METRICS_PORT", raising=False)
    assert metrics.serve("worker rank 0", None, "worker", 0) is None   # off: no port asked


def test_missing_prometheus_client_is_one_clear_warning(monkeypatch):
    monkeypatch.setattr(metrics, "available", lambda: False)
    text = metrics.check_env({"BYTEPS_METRICS_PORT": "9400"})
    assert "prometheus-client is not installed" in text and "[metrics]" in text
    assert metrics.check_env({}) is None


def test_live_modes_and_lines():
    tty, pipe = io.StringIO(), io.StringIO()
    tty.isatty = lambda: True
    assert liveview.mode(None, {}, tty) == "tty"
    assert liveview.mode(False, {}, tty) is None
    assert liveview.mode(None, {}, pipe) is None
    assert liveview.mode(None, {"BYTEPS_LIVE_INTERVAL_S": "5"}, pipe) == "log"
    assert liveview.mode(None, {"BYTEPS_LOG_LEVEL": "info"}, pipe) == "log"
    assert liveview.mode(True, {}, pipe) == "log"
    with pytest.raises(ConfigError, match="BYTEPS_LIVE_INTERVAL_S"):
        liveview.interval({"BYTEPS_LIVE_INTERVAL_S": "0"})
    doc = {"host": "host1", "step": 12, "MBps": 35.25, "round_ms": 4.12,
           "slowest_server": 1, "slowest_ms": 6.3, "t": 100.0}
    assert liveview.line(doc, 1, 101.0, 5.0) == (
        "worker 1 (host1): step 12, push_pull 35.2 MB/s, round 4.1 ms, slowest server 1 "
        "(6.3 ms)")
    assert liveview.line(doc, 1, 120.0, 5.0).endswith("(no update for 20 s)")
    assert liveview.line(None, 0, 0.0, 5.0) == "worker 0: starting"


# ---------------------------------------------------------------- a real job
def _free_range(n: int) -> int:
    """A base port with n free ports after it (loopback)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65000:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no range of free ports")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in\n{text}"
    return float(m.group(1))


def test_scrape_worker_server_and_scheduler_during_a_job(tmp_path):
    base = _free_range(5)            # scheduler, 1 server, 2 workers
    stop = tmp_path / "stop"
    p = subprocess.Popen(BPSLAUNCH + ["-np", "2", "--hosts", "2", "-s", "1", *JOB, str(stop),
                                      "60"],
                         env=job_env(BYTEPS_METRICS_PORT=base, BYTEPS_ENABLE_IPC=0), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, worker = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            assert p.poll() is None, p.communicate()[0]
            try:
                worker = _scrape(base + 3)          # worker rank 1: base + 1 + 1 server + 1
                if _value(worker, "byteps_worker_step") >= 5:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        server, sched = _scrape(base + 1), _scrape(base)
        worker0 = _scrape(base + 2)
    finally:
        stop.touch()
        out = p.communicate(timeout=60)[0]
    assert p.returncode == 0, out
    for text, rank in ((worker, 1), (worker0, 0)):
        assert _value(text, "byteps_worker_pushed_bytes_total") > 1e6
        assert _value(text, "byteps_worker_pulled_bytes_total") > 1e6
        assert _value(text, "byteps_worker_push_pulls_total") >= 10
        assert f'byteps_worker_round_seconds_bucket{{le="+Inf",rank="{rank}",server="0"}}' \
            in text
        assert _value(text, "byteps_worker_round_seconds_count") >= 10
        assert _value(text, "byteps_worker_heartbeat_age_seconds") < 30
        assert "byteps_worker_queue_depth" in text
    assert _value(server, "byteps_server_received_bytes_total") > 1e6
    assert _value(server, "byteps_server_rounds_total") >= 10
    assert _value(server, "byteps_server_stall_reports_total") == 0
    assert 'byteps_scheduler_nodes{role="worker"} 2.0' in sched
    assert "byteps_scheduler_heartbeat_age_seconds{" in sched


def test_live_view_redraws_on_a_terminal():
    text = on_terminal(BPSLAUNCH + ["-np", "2", "--hosts", "2", *JOB, "/nonexistent/stop", "4"],
                       job_env(BYTEPS_ENABLE_IPC=0))
    for r in (0, 1):
        steps = [int(s) for s in re.findall(
            rf"\r\x1b\[2Kbpslaunch: worker {r} \(host{r}\): step (\d+), push_pull "
            rf"[\d.]+ MB/s, round [\d.]+ ms, slowest server 0", text)]
        assert len(steps) >= 2 and steps[-1] > steps[0], text     # refreshed, and it moved
    assert "\x1b[2F\x1b[J" in text                          # redrawn in place
    assert "[worker 0] rank 0 done" in text and "[worker 1] rank 1 done" in text
    # the block is erased before the summaries: they are the last lines, unmixed
    tail = text.replace("\r\n", "\n").rstrip("\n").split("\n")[-2:]
    assert all("bpslaunch: worker rank" in t for t in tail) and "\x1b" not in tail[-1], tail


def test_periodic_info_lines_without_a_terminal():
    res = subprocess.run(BPSLAUNCH + ["-np", "2", "--hosts", "2", *JOB, "/nonexistent/stop",
                                      "3"],
                         env=job_env(BYTEPS_ENABLE_IPC=0, BYTEPS_LIVE_INTERVAL_S="0.5"),
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stderr
    for r in (0, 1):
        lines = re.findall(rf"^bpslaunch: INFO worker {r} \(host{r}\): step \d+, push_pull "
                           rf"[\d.]+ MB/s", res.stderr, re.MULTILINE)
        assert len(lines) >= 2, res.stderr
    quiet = subprocess.run(BPSLAUNCH + ["-np", "1", *JOB, "/nonexistent/stop", "1"],
                           env=job_env(BYTEPS_ENABLE_IPC=0), cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert quiet.returncode == 0 and "INFO worker" not in quiet.stderr, quiet.stderr

"""The live dashboard, the hang doctor and straggler attribution (docs/dashboard.md).

In-process: the report validation, straggler attribution, the hang doctor's text, the HTTP
side of a real scheduler (token, /api/status shape, /api/events) and the sampled timeline's
size.  One end-to-end job (4 workers on 4 emulated hosts) is watched in headless Chromium
(Debian's ``chromium`` + ``chromium-driver``, selenium): every rank's row with numbers that
move, the compute straggler named, ``bpslaunch --stacks`` and ``kill -USR1`` printing the
workers' stacks, and a rank stuck
in ``stuck_here()`` named with its file and line within BYTEPS_STALL_WARNING_S + 5 s, on the
page and in bpslaunch's output.  As root, a job of network namespaces with one worker's link
shaped by ``tc`` names that rank a network straggler.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, SCRIPTS, job_env

from byteps import dashboard
from byteps.dashboard import reports
from byteps.dashboard.doctor import Doctor, where

pytestmark = pytest.mark.timeout(180)


def _report(**kw) -> dict:
    rep = {"step": 12, "step_ms": 110.0, "wait_ms": 90.0, "MBps": 3.5, "bytes": 10 ** 6,
           "bytes_step": 400_000, "srv_ms": [4.0, -1.0], "pid": 42, "in_step_s": 0.05,
           "last": "grad.0", "inflight": 0, "mode": "sync", "comp": "none", "ratio": 1.0,
           "tune": {"state": "done", "partition_bytes": 4096000, "credit_bytes": 16384000,
                    "chosen": [4096000, 16384000]}}
    rep.update(kw)
    return rep


# ---------------------------------------------------------------- pure logic
def test_reports_are_validated_field_by_field():
    rep = reports.clean(_report(unknown="dropped", stacks=[["MainThread", [["t.py", 3, "f"]]]],
                                trace="/t/0/comm.json", trace_written=False))
    assert (rep["trace"], rep["trace_written"]) == ("/t/0/comm.json", False)
    assert rep["step"] == 12 and rep["srv_ms"] == [4.0, -1.0] and "unknown" not in rep
    assert rep["stacks"] == [["MainThread", [["t.py", 3, "f"]]]]
    for bad, field in ((_report(step="12"), "step"), (_report(step=True), "step"),
                       (_report(step_ms=float("nan")), "step_ms"), (_report(MBps=-1.0), "MBps"),
                       (_report(last="x" * 201), "last"), (_report(srv_ms=[1, "a"]), "srv_ms"),
                       (_report(stacks=[["t", [["f", "1", "g"]]]]), "stacks.line"),
                       (_report(stacks=[["t", [["f", 1]]]]), "stacks"),
                       (_report(tune={"chosen": [1]}), "tune.chosen"), ([], "map"),
                       (_report(trace_written=1), "trace_written")):
        with pytest.raises(ValueError, match=field):
            reports.clean(bad)


def test_stragglers_compute_and_network_are_told_apart():
    # a synchronous job: rank 3 computes 80 ms longer; the others wait for it (their wait
    # grows, so their compute = step - wait stays ~20 ms)
    compute = {0: {"compute_ms": 21.0, "wait_ms": 90.0, "push_ms": 2.0},
               1: {"compute_ms": 20.5, "wait_ms": 90.5, "push_ms": 2.5},
               2: {"compute_ms": 21.5, "wait_ms": 89.0, "push_ms": 1.9},
               3: {"compute_ms": 101.0, "wait_ms": 10.0, "push_ms": 2.1}}
    s = reports.stragglers(compute)
    assert s["rank"] == 3 and s["kind"] == "compute" and "slow to compute" in s["text"]
    # rank 2's link is 10x slower: every rank computes alike and waits alike (each round
    # waits for rank 2), but rank 2's pushes take longest to reach the servers
    network = {0: {"compute_ms": 20.0, "wait_ms": 288.0, "push_ms": 3.0},
               1: {"compute_ms": 20.4, "wait_ms": 288.5, "push_ms": 2.5},
               2: {"compute_ms": 20.2, "wait_ms": 288.1, "push_ms": 160.0},
               3: {"compute_ms": 19.8, "wait_ms": 288.2, "push_ms": 2.8}}
    s = reports.stragglers(network)
    assert s["rank"] == 2 and s["kind"] == "network" and "slow to communicate" in s["text"]
    # the noise of a loaded machine names nobody
    even = {r: {"compute_ms": 20.0 + r * 2.5, "wait_ms": 5.0, "push_ms": 2.0 + r}
            for r in range(4)}
    assert reports.stragglers(even) is None
    assert reports.stragglers({0: compute[3]}) is None


def test_series_of_a_large_job_keeps_min_median_max():
    from byteps.dashboard.view import SERIES_RANKS, _point
    rows = [{"rank": r, "step_ms": 100.0 + r, "MBps": 5.0} for r in range(SERIES_RANKS + 8)]
    assert _point(rows) == {"min": [100.0, 5.0], "median": [120.0, 5.0], "max": [139.0, 5.0]}
    assert _point(rows[:2]) == {0: [100.0, 5.0], 1: [101.0, 5.0]}


def test_hang_doctor_names_the_stuck_function_from_a_server_stall(caplog):
    doc = Doctor(warn_s=2.0)
    now = time.monotonic()
    frames = [["/job/train.py", 88, "main"], ["/job/train.py", 41, "stuck_here"]]
    doc.stall({"text": "t", "tensor": "fc1.weight", "round": 57, "age": 2.0,
               "missing": [1], "fatal": False}, now)
    doc.stall({"tensor": "x", "round": "1", "missing": [1]}, now)   # malformed: ignored
    ranks = {1: {"host": "h1", "pid": 4711, "state": "running", "report_t": now,
                 "report": reports.clean(_report(stacks=[["MainThread", frames]]))}}
    made = doc.tick(now, ranks)
    assert len(made) == 1 and not doc.pending
    text = made[0]["text"]
    assert text.startswith("rank 1 (host h1, pid 4711) has not pushed 'fc1.weight' round 57")
    assert "train.py:41 in stuck_here() <- train.py:88 in main()" in text
    assert "last completed: 'grad.0' at step 12" in text
    assert "hang doctor: rank 1" in caplog.text
    assert doc.tick(now + 1, ranks) == []            # once per rank and step
    assert where([["/a/b.py", 1, "f"]]) == "b.py:1 in f()"


def test_stacks_name_threads_blocked_in_c_calls():
    """The hang doctor's stacks name a thread stuck inside a C call (time.sleep, a socket
    read) by the Python line that made it."""
    import socket
    import threading

    from byteps.core.api import reporter
    a, b = socket.socketpair()
    ready = threading.Barrier(3)

    def asleep_in_c_call():
        ready.wait()
        time.sleep(30)

    def reading_a_socket():
        ready.wait()
        a.recv(1)

    threads = [threading.Thread(target=f, daemon=True, name=f.__name__)
               for f in (asleep_in_c_call, reading_a_socket)]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(0.2)
    out = []           # read from another thread, as the engine thread does (it skips itself)
    reader = threading.Thread(target=lambda: out.extend(
        reporter.stacks(threading.main_thread().ident)), name="byteps-test-reader")
    reader.start()
    reader.join(10)
    got = dict(out)
    assert "byteps-test-reader" not in got                # our own threads are left out
    b.send(b"x")
    assert "test_stacks_name_threads_blocked_in_c_calls" in [f[2] for f in got["MainThread"]]
    assert next(iter(got)) == "MainThread"           # the main thread first
    for name in ("asleep_in_c_call", "reading_a_socket"):
        assert got[name][-1][2] == name and got[name][-1][0] == __file__, got[name]
    assert reports.clean({"stacks": [[n, f] for n, f in got.items()][:16]})["stacks"]
    a.close()
    b.close()


def test_sampled_trace_of_10000_steps_stays_small(tmp_path):
    """BYTEPS_TRACE_SAMPLE=100: 10,000 steps of 10 tensors write a trace under 5 MB."""
    from byteps.core.timeline import StepCounter, Timeline
    steps = StepCounter()
    tl = Timeline(str(tmp_path), 0, 4, 0, 1 << 30, steps=steps, sample=100)
    out = types.SimpleNamespace(nbytes=4096)
    hid = 0
    for _ in range(10_000):
        t0 = time.monotonic()
        for i in range(10):
            hid += 1
            tl.begin(hid, f"grad.{i}", t0)
            if tl.traced(hid):
                h = types.SimpleNamespace(id=hid, out=out, error=None)
                task = types.SimpleNamespace(handle=h, part=0, nbytes=4096, server=i % 2,
                                             sent_at=t0 + 1e-4)
                tl.acked(task, t0 + 2e-4)
                tl.part_done(task, t0 + 3e-4, t0 + 4e-4)
                tl.handle_done(h, t0 + 4e-4)
        steps.mark()
    path = tl.write()
    size = os.path.getsize(path)
    with open(path) as f:
        doc = json.load(f)
    assert doc["otherData"]["sample"] == 100
    traced = {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "tensor"}
    assert traced == set(range(0, 10_000, 100)), sorted(traced)[:5]
    assert size < 5e6, size


# ---------------------------------------------------------------- a real scheduler's HTTP side
def _get(url: str, timeout: float = 10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_token_status_and_events(monkeypatch):
    from byteps.common.config import Config
    from byteps.scheduler import Scheduler
    from byteps.transport.wire import Header, Op
    secret = "s3cret-of-this-job"
    env = {"DMLC_ROLE": "scheduler", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
           "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(_free_port()),
           "BYTEPS_JOB_SECRET": secret}
    monkeypatch.setenv("BYTEPS_DASHBOARD_PORT", "0")
    sched = Scheduler(Config.from_env(env, role="scheduler", warn_unknown=False))
    try:
        port = dashboard.start(sched)
        assert port
        w = {"role": "worker", "rank": 0, "node_id": 2, "host_id": "h0", "pid": 7}
        sched.workers[b"w0"] = w
        sched.formed = True
        body = {"report": _report()}
        sched.view.note(b"w0", w, Header(4, "j", 2, Op.HEARTBEAT, 1, 1, body))
        bad = {"report": _report(step=-1)}
        sched.view.note(b"w0", w, Header(4, "j", 2, Op.HEARTBEAT, 1, 2, bad))  # dropped
        w1 = {"role": "worker", "rank": 1, "node_id": 3, "host_id": "h1", "pid": 8}
        sched.workers[b"w1"] = w1
        srv = {"role": "server", "rank": -1, "node_id": 1, "host": "127.0.0.1",
               "address": "tcp://127.0.0.1:1"}
        sched.servers[b"s0"] = srv
        rep = {"keys": 3, "bytes": 10 ** 6, "rounds": 40, "open": 1, "queue": 0,
               "replica": "off"}
        sched.view.note(b"s0", srv, Header(4, "j", 1, Op.HEARTBEAT, 1, 1, {"report": rep}))
        sched.view.note(b"s0", srv, Header(4, "j", 1, Op.HEARTBEAT, 1, 2,
                                           {"report": dict(rep, keys="3")}))     # dropped
        sched.view.refresh(time.monotonic(), True)
        sched.exited.add(b"w1")                       # rank 1 ends: shown as gone
        sched.view.refresh(time.monotonic(), True)
        base = f"http://127.0.0.1:{port}"
        tok = dashboard.token(secret)
        assert tok and secret not in tok and dashboard.token(None) is None
        assert dashboard.url("h", 1, secret) == f"http://h:1/?token={tok}"
        for path in ("/", "/api/status", "/api/events", "/api/status?token=wrong"):
            code, text = _get(base + path)
            assert code == 403 and b"token" in text, (path, code)
        code, page = _get(f"{base}/?token={tok}")
        assert code == 200 and b"<svg id=\"plot_step\"" in page and b"http" not in \
            page.split(b"<script>")[1].replace(b"http://www.w3.org/2000/svg", b"")
        code, data = _get(f"{base}/api/status?token={tok}")
        doc = json.loads(data)
        assert code == 200 and doc["epoch"] == sched.epoch and doc["formed"] is True
        for key in ("job", "workers", "servers", "config", "straggler", "warnings", "doctor",
                    "events", "series"):
            assert key in doc, key
        row = doc["workers"][0]
        assert (row["rank"], row["host"], row["state"], row["step"]) == (0, "h0", "running", 12)
        assert row["compute_ms"] == 20.0 and row["round_ms"] == 4.0 and row["stuck"] is False
        assert doc["config"]["autotune"]["chosen"] == [4096000, 16384000]
        assert doc["workers"][1]["state"] == "exited"
        assert "rank 1 (host h1) exited" in doc["warnings"]
        assert any("rank 1 (host h1): exited" in text for _, text in doc["events"])
        server = doc["servers"][0]
        assert (server["keys"], server["rounds"], server["open"], server["replica"],
                server["state"]) == (3, 40, 1, "off", "running")
        with urllib.request.urlopen(f"{base}/api/events?token={tok}", timeout=10) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            line = r.readline()
            assert line.startswith(b"data: {") and json.loads(line[6:])["job"] == doc["job"]
        assert _get(f"{base}/nothing?token={tok}")[0] == 404
    finally:
        sched.view.stop.set()
        if sched.view.http is not None:
            sched.view.http.shutdown()
            sched.view.http.server_close()
        sched.watch.close()
        sched.sock.close(0)
        sched.ctx.term()


# ---------------------------------------------------------------- a job in headless Chromium
def _chrome():
    pytest.importorskip("selenium")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium and chromium-driver (installed by .ci/run)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def _until(what, fn, timeout: float, every: float = 0.3):
    end = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def test_dashboard_in_headless_chromium(tmp_path):
    warn = 2.0
    port = _free_port()
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--hosts", "4",
           "--local-size", "1", "-s", "1", "--dashboard", str(port), sys.executable,
           str(SCRIPTS / "dashboard_job.py"), str(tmp_path), "3", "1", "90"]
    env = job_env(BYTEPS_STALL_WARNING_S=warn, BYTEPS_TRACE_ON=1, BYTEPS_TRACE_SAMPLE=10,
                  BYTEPS_TRACE_DIR=tmp_path / "traces")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    driver = None
    try:
        first = proc.stdout.readline()
        assert "dashboard at http://127.0.0.1:" in first and "?token=" in first, first
        url = first.split("dashboard at ", 1)[1].strip()
        driver = _chrome()
        driver.get(url)

        def cells(rank):        # read in one script: the rows are redrawn on every update
            return driver.execute_script(
                "return Array.from(document.querySelectorAll("
                f"\"#ranks tr[data-rank='{rank}'] td\"), td => td.textContent);")

        def text(elem_id):
            return driver.execute_script(
                f"return document.getElementById('{elem_id}').textContent;")

        def steps():
            rows = {r: cells(r) for r in range(4)}
            ok = all(len(c) == 13 and c[4].isdigit() and c[5] != "-" for c in rows.values())
            return {r: int(c[4]) for r, c in rows.items()} if ok else None
        before = _until("every rank's row with a step", steps, 90)
        def moved():
            now = steps()
            return now if now and all(now[r] > before[r] for r in range(4)) else None
        after = _until("the steps to move", moved, 20)
        assert all(float(cells(r)[8]) > 0 for r in range(4))       # MB/s
        traces = text("traces")
        assert all(f"rank {r}: {tmp_path / 'traces' / str(r) / 'comm.json'}" in traces
                   for r in range(4)), traces
        got = subprocess.run([sys.executable, "-m", "byteps.launcher", "--stacks", url],
                             env=job_env(), cwd=ROOT, capture_output=True, text=True,
                             timeout=60)                     # bpslaunch --stacks URL
        assert got.returncode == 0, got.stderr
        for r in range(4):
            block = got.stdout.split(f"rank {r} (host host{r}")[1].split("\nrank ")[0]
            assert "thread MainThread:" in block and "dashboard_job.py:" in block, got.stdout
        pid0 = int(cells(0)[2])
        os.kill(pid0, signal.SIGUSR1)          # rank 0 prints its stacks (kill -USR1)
        assert _until("the server's keys", lambda: driver.execute_script(
            "return document.querySelector('#servers tr[data-index=\"0\"] td:nth-child(5)')"
            ".textContent;") not in (None, "-", "0"), 10)
        assert text("conn") == "live"
        _until("rank 3 named a compute straggler", lambda: "rank 3 is slow to compute" in
               text("straggler"), 30)
        assert min(after.values()) > 0
        (tmp_path / "stuck").touch()
        stuck_at = float(_until("rank 1 to be stuck", lambda: (tmp_path / "stuck_at").exists()
                                and (tmp_path / "stuck_at").read_text(), 30))
        report = _until("the hang doctor on the page", lambda: "stuck_here" in
                        text("doctor") and text("doctor"), warn + 10)
        seen = time.time()
        assert "rank 1 " in report and "dashboard_job.py:" in report and "'a'" in report, \
            report
        assert seen - stuck_at <= warn + 5, (seen - stuck_at, report)
        assert driver.execute_script(
            "return document.querySelector(\"#ranks tr[data-rank='1']\").className;") == "stuck"
        if os.environ.get("BYTEPS_DASHBOARD_SCREENSHOT"):
            driver.save_screenshot(os.environ["BYTEPS_DASHBOARD_SCREENSHOT"])
        (tmp_path / "unstuck").touch()
        (tmp_path / "stop").touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if driver is not None:
            driver.quit()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert f"byteps: stacks of pid {pid0} (SIGUSR1):" in out, out
    trace = json.loads((tmp_path / "traces" / "0" / "comm.json").read_text())
    steps = {e["args"]["step"] for e in trace["traceEvents"] if e.get("cat") == "tensor"}
    assert steps and all(n % 10 == 0 for n in steps), sorted(steps)    # BYTEPS_TRACE_SAMPLE
    assert "dashboard_job.py" in out.split(f"stacks of pid {pid0}")[1], out
    doctor = [ln for ln in out.splitlines() if "hang doctor:" in ln]
    assert doctor and "stuck_here()" in doctor[0] and "dashboard_job.py:" in doctor[0], out


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- a slow link, emulated
@pytest.mark.root
def test_network_straggler_on_a_shaped_link(tmp_path):
    """Six machines as network namespaces (tests/podnet.py): worker 2's link is shaped to
    20 Mbit/s both ways (tc), the others are unshaped veths; every rank computes alike.
    The scheduler names rank 2 slow to communicate (needs root and iproute2's tc)."""
    import podnet
    why = podnet.skip_reason() or (None if shutil.which("tc") else "no tc (iproute2)")
    if why:
        pytest.skip(why)
    names = ["sched", "server-0"] + [f"worker-{i}" for i in range(4)]
    script = [sys.executable, str(SCRIPTS / "dashboard_job.py"), str(tmp_path), "-1", "-1",
              "7"]
    with podnet.PodNet(names) as net:
        for dev, ns in (("eth0", net.ns["worker-2"]), ("p4", net.switch)):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                            "tbf", "rate", "20mbit", "burst", "64kb", "latency", "2s"],
                           check=True, capture_output=True, timeout=30)
        base = dict(job_env(), PYTHONUNBUFFERED="1", DMLC_NUM_WORKER="4", DMLC_NUM_SERVER="1",
                    DMLC_PS_ROOT_URI=net.ip["sched"], DMLC_PS_ROOT_PORT="9510",
                    BYTEPS_JOB_ID="shaped", BYTEPS_JOB_SECRET="shaped-link-secret",
                    BYTEPS_AUTOTUNE="0")
        procs = []
        try:
            for name in names:
                role = name.split("-")[0].replace("sched", "scheduler")
                env = dict(base, DMLC_ROLE=role, DMLC_NODE_HOST=net.ip[name])
                if role == "worker":
                    env["DMLC_WORKER_ID"] = name.split("-")[1]
                cmd = [sys.executable, "-m", f"byteps.{role}"] if role != "worker" else script
                procs.append(subprocess.Popen(net.argv(name, env, cmd), cwd=ROOT,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            outs = [p.communicate(timeout=90)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    sched = outs[0]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    lines = [ln for ln in sched.splitlines() if "straggler:" in ln]
    assert lines and "rank 2 is slow to communicate" in lines[-1], sched
    assert not [ln for ln in lines if "slow to compute" in ln], sched


def test_launcher_dashboard_option():
    """``--dashboard`` takes an optional PORT; a word after it is the command, and the
    command's own arguments are never touched."""
    from byteps.launcher import dashboard as opt
    from byteps.launcher import parser
    ap = parser()
    for argv, port, cmd in ((["-np", "2", "--dashboard", "python", "t.py"], 0, ["python", "t.py"]),
                            (["--dashboard", "8080", "python"], 8080, ["python"]),
                            (["-H", "a:1,b:1", "--dashboard", "python"], 0, ["python"]),
                            (["python", "t.py", "--dashboard"], None,
                             ["python", "t.py", "--dashboard"])):
        args = ap.parse_args(opt.fix_argv(argv, ap))
        assert (args.dashboard, args.command) == (port, cmd), argv
    base = {"DMLC_PS_ROOT_URI": "127.0.0.1", "BYTEPS_JOB_SECRET": "x"}
    opt.standalone_env(types.SimpleNamespace(dashboard=0), base, lambda: 4242)
    assert base["BYTEPS_DASHBOARD_PORT"] == "4242" and base[opt.SAID] == "1"

"""The emulated-cluster harness (benchmarks/cluster): logic without root, one run as root."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.cluster import jobs, netns, report, run
from benchmarks.cluster.netns import NetnsError, Plan
from byteps.core.timeline import Timeline

IS_ROOT = os.geteuid() == 0


# ------------------------------------------------------------------ address planning
def test_rates_and_tbf():
    assert netns.rate_bps("1gbit") == 1e9
    assert netns.rate_bps("200mbit") == 2e8
    assert netns.rate_bps("500kbit") == 5e5
    with pytest.raises(ValueError, match="use e.g. 1gbit"):
        netns.rate_bps("1 gig")
    a = netns.tbf_args("1gbit")                              # 10 ms of traffic
    assert a[:3] == ["tbf", "rate", "1gbit"] and int(a[4]) == 1_250_000
    assert a[5:] == ["latency", "50ms"]
    assert int(netns.tbf_args("1gbit", burst_ms=1)[4]) == 125_000
    assert int(netns.tbf_args("1mbit")[4]) == 80 * 1024       # a whole GSO packet fits
    assert int(netns.tbf_args("200mbit", burst_ms=2)[4]) == 80 * 1024


def test_plan_names_addresses_and_commands():
    p = Plan(3, "bpsc-123-abcd")
    hosts = p.hosts
    assert [h.ns for h in hosts] == ["bpsc-123-abcd-h0", "bpsc-123-abcd-h1", "bpsc-123-abcd-h2"]
    assert len({h.ip for h in hosts}) == 3 and hosts[0].ip == "10.213.0.10"
    assert p.switch == "bpsc-123-abcd-sw"
    setup = p.setup_commands()
    adds = [c for c in setup if "add" in c and "link" in c]
    # every device is created inside a namespace (-n), never in the root namespace
    assert all(c[1] == "-n" for c in adds)
    veths = [c for c in adds if "veth" in c]
    assert len(veths) == 3 and all(c[-2:] == ["netns", p.switch] for c in veths)
    assert setup[0] == ["ip", "netns", "add", p.switch]
    shape = p.shape_commands("1gbit")
    assert len(shape) == 6                                   # both ends of 3 links
    assert {(c[2], c[6]) for c in shape} == {(h.ns, "eth0") for h in hosts} | {
        (p.switch, h.port) for h in hosts}
    assert all(c[3:5] == ["qdisc", "replace"] for c in shape)
    assert all(c[3:5] == ["qdisc", "del"] for c in p.shape_commands(None))
    assert sorted(c[-1] for c in p.teardown_commands()) == sorted(
        [h.ns for h in hosts] + [p.switch])
    pre = p.exec_prefix(hosts[1], {"B": "2", "A": "1"})
    assert pre == ["ip", "netns", "exec", hosts[1].ns, "env", "-i", "A=1", "B=2"]


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError, match="1..200 hosts"):
        Plan(0, "bpsc-1-ab")
    with pytest.raises(ValueError, match="must start with"):
        Plan(2, "mine-1-ab")
    fresh = Plan.new(2)
    assert fresh.prefix.startswith(f"bpsc-{os.getpid()}-")


def test_leftovers_only_of_dead_runs():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    names = [f"bpsc-{dead.pid}-ab12-h0", f"bpsc-{dead.pid}-ab12-sw", f"bpsc-{live}-cd34-h1",
             "someone-else", "bpsc-notapid-h0"]
    assert netns.leftovers(names) == names[:2]
    assert netns.leftovers(names, include_live=True) == names[:3]


def test_check_root_says_how(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetnsError, match="needs root.*sudo"):
        netns.check_root()


# ------------------------------------------------------------------ command lines
def test_byteps_job_roles_and_env():
    p = Plan(4, "bpsc-1-ab")
    w, s = p.hosts[:2], p.hosts[2:]
    specs = jobs.byteps_job(w, s, s[0], ["python", "x.py"], 9000, {"BYTEPS_TRACE_ON": 1})
    roles = [sp.env["DMLC_ROLE"] for sp in specs]
    assert roles == ["scheduler", "server", "server", "worker", "worker"]
    for sp in specs:
        assert sp.env["DMLC_PS_ROOT_URI"] == s[0].ip           # the scheduler's host
        assert sp.env["DMLC_PS_ROOT_PORT"] == "9000"
        assert sp.env["DMLC_NUM_WORKER"] == "2" and sp.env["DMLC_NUM_SERVER"] == "2"
        assert sp.env["DMLC_NODE_HOST"] == sp.host.ip
        assert sp.env["BYTEPS_TRACE_ON"] == "1"
        assert sp.argv[1:3] == ["-m", "byteps.launcher"]
    assert len({sp.env["BYTEPS_JOB_SECRET"] for sp in specs}) == 1
    workers = [sp for sp in specs if sp.env["DMLC_ROLE"] == "worker"]
    assert [sp.env["DMLC_WORKER_ID"] for sp in workers] == ["0", "1"]
    assert all(sp.critical and sp.argv[-2:] == ["python", "x.py"] for sp in workers)
    assert not any(sp.critical for sp in specs if sp.env["DMLC_ROLE"] != "worker")
    cmd = workers[1].command(p)
    assert cmd[:4] == ["ip", "netns", "exec", w[1].ns] and "DMLC_ROLE=worker" in cmd
    with pytest.raises(ValueError, match="at least one"):
        jobs.byteps_job([], s, s[0], ["x"], 1)


def test_gloo_and_probe_jobs():
    p = Plan(3, "bpsc-1-ab")
    g = jobs.gloo_job(p.hosts, ["python", "g.py"], 7000)
    assert [sp.env["RANK"] for sp in g] == ["0", "1", "2"]
    assert {sp.env["MASTER_ADDR"] for sp in g} == {p.hosts[0].ip}
    assert all(sp.env["WORLD_SIZE"] == "3" and sp.env["GLOO_SOCKET_IFNAME"] == "eth0"
               for sp in g)
    pr = jobs.probe_job([(p.hosts[0], p.hosts[1]), (p.hosts[2], p.hosts[1])], 8000, 1.5)
    assert [sp.argv[2] for sp in pr] == ["serve", "send", "serve", "send"]
    assert pr[1].argv[3:6] == [p.hosts[1].ip, "8000", "1.5"] and pr[3].argv[4] == "8001"


def test_parse_results_ignores_noise():
    text = ("hello\nCLUSTER_RESULT {\"a\": 1}\nCLUSTER_RESULT not json\n"
            "CLUSTER_RESULT [1, 2]\n  CLUSTER_RESULT {\"b\": 2}\nCLUSTER_RESULT {\"c\": 3}\n")
    assert jobs.parse_results(text) == [{"a": 1}, {"c": 3}]


# ------------------------------------------------------------------ running and clean-up
class LocalPlan:
    """Runs specs on this host (no namespaces) to test process handling without root."""

    def exec_prefix(self, host, env):
        return ["env", "-i", *[f"{k}={v}" for k, v in env.items()]]


def _spec(what, code, critical=True):
    return jobs.Spec(what, None, [sys.executable, "-c", code], jobs.base_env(), critical)


def test_run_specs_collects_and_ends_services():
    t = time.monotonic()
    out = jobs.run_specs(LocalPlan(), [
        _spec("worker", "print('CLUSTER_RESULT {\"x\": 1}')"),
        _spec("service", "import time; time.sleep(60)", critical=False)], timeout=30,
        grace_s=0.5)
    assert time.monotonic() - t < 20                 # the service was ended, not awaited
    assert jobs.collect(out) == [{"x": 1}]
    assert out[1].returncode != 0


def test_run_specs_failure_and_timeout_kill_everything(tmp_path):
    pidfile = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); " \
              f"time.sleep(60)"
    with pytest.raises(jobs.JobError, match="worker 1 exited with code 3"):
        jobs.run_specs(LocalPlan(), [_spec("worker 0", sleeper),
                                     _spec("worker 1", "import time, sys; time.sleep(0.5); "
                                           "sys.stderr.write('boom'); sys.exit(3)")], 30)
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(jobs.JobError, match="timed out after 1 s"):
        jobs.run_specs(LocalPlan(), [_spec("worker", "import time; time.sleep(60)")], 1)


# ------------------------------------------------------------------ results
def _recs(system, n, t, nbytes=100_000_000):
    return [{"system": system, "rank": r, "size": n, "bytes": nbytes,
             "times": [t, t * 1.1, t * 0.9]} for r in range(n)]


def test_rows_ratios_table_and_plot(tmp_path):
    gloo = report.make_row("gloo", "1gbit", 4, 4, _recs("gloo", 4, 1.2))
    ps = report.make_row("byteps", "1gbit", 4, 4, _recs("byteps", 4, 0.8), 1.2, 0.95e9 / 8)
    assert ps["time_s"] == pytest.approx(0.8)
    assert ps["vs_gloo"] == pytest.approx(1.5)
    assert ps["vs_bound"] == pytest.approx(1.0)          # 100 MB at 1 Gbit/s = 0.8 s
    assert ps["link_Gbps"] == pytest.approx(1.0)
    assert ps["vs_measured_tcp"] == pytest.approx(1 / 0.95)
    assert gloo["link_Gbps"] == pytest.approx(1.5 * 0.8 / 1.2)   # ring moves 1.5 M per link
    slow = _recs("byteps", 2, 0.5)
    slow[1]["times"] = [0.7, 0.7, 0.7]
    assert report.job_time(slow) == pytest.approx(0.7)   # the slowest rank
    text = report.table([ps, gloo], {"1gbit": {"pair_Gbps": 0.95, "all_Gbps": 0.94}})
    assert "byteps" in text and "1.50" in text and "0.950 Gbit/s" in text
    tr = report.train_row("byteps", "1gbit", 2, [{"img_sec": 10.0}, {"img_sec": 12.0}], 11.0)
    assert tr["img_sec_total"] == 22.0 and tr["vs_ddp"] == pytest.approx(2.0)
    pytest.importorskip("matplotlib")
    png = report.plot([ps, gloo], tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_raw_mesh_and_the_steps_from_the_third_on():
    """byteps as a fraction of the raw worker-server mesh next to its gloo ratio; a loop
    without step marks is reported from its 3rd step on (the slowest rank per step)."""
    recs = _recs("byteps", 2, 0.8)
    recs[0]["all_times"] = [2.0, 1.2, 0.9, 0.8, 0.8]
    recs[1]["all_times"] = [1.8, 1.4, 0.8, 1.0, 0.8]
    row = report.make_row("byteps-nomarks", "1gbit", 2, 2, recs, 1.2, None, 0.9e9 / 8)
    assert row["vs_mesh"] == pytest.approx(1.0 / 0.9)     # 1 Gbit/s per link of 0.9
    assert row["step_times_s"] == [2.0, 1.4, 0.9, 1.0, 0.8]
    assert row["first2_s"] == pytest.approx(1.7) and row["from3_s"] == pytest.approx(0.9)
    assert row["vs_gloo_from3"] == pytest.approx(1.2 / 0.9)
    text = report.table([row], {"1gbit": {"mesh_Gbps": 0.9}})
    assert "byteps-nomarks" in text and "0.900 Gbit/s per worker link" in text
    assert "1.11" in text and "1.33" in text       # vs mesh, from the 3rd step x gloo
    assert report.make_row("gloo", "1gbit", 2, 2, _recs("gloo", 2, 1))["vs_mesh"] is None


def test_rounds_have_their_own_mesh_and_the_table_their_medians():
    """--rounds N alternates the systems; each row is measured against the raw mesh run
    just before and after it, and the table ends with each system's medians over rounds."""
    rows = []
    for rnd, (t_ps, t_gloo, mesh) in enumerate([(0.9, 1.3, 0.95), (1.0, 1.2, 0.80),
                                                 (0.8, 1.2, 0.90)], 1):
        gloo_s = report.job_time(_recs("gloo", 4, t_gloo))
        for system, t in (("byteps", t_ps), ("gloo", t_gloo)):
            rows.append(dict(report.make_row(system, "1gbit", 4, 4, _recs(system, 4, t),
                                             gloo_s, None, mesh * 1e9 / 8),
                             round=rnd, mesh_Gbps=mesh))
    text = report.table(rows, {})
    assert "byteps #3" in text and "gloo #2" in text and "0.800" in text
    (line,) = [x for x in text.splitlines() if x.startswith("byteps W=4, median of 3")]
    # vs gloo 1.44, 1.20, 1.50; vs mesh 0.8/0.9/0.95=0.94, 0.8/1.0/0.8=1.00, 1.11
    assert "vs gloo 1.44 (1.20-1.50)" in line and "vs mesh 1.00 (0.94-1.11)" in line
    assert not any(x.startswith("gloo W=4, median") for x in text.splitlines())
    ddp = [dict(report.train_row("ddp-gloo", "1gbit", 2, [{"img_sec": 10.0}] * 2), round=r)
           for r in (1, 2)]
    bps = [dict(report.train_row("byteps", "1gbit", 2, [{"img_sec": v}] * 2, 20.0), round=r)
           for r, v in ((1, 12.0), (2, 14.0))]
    text = report.train_table([ddp[0], bps[0], ddp[1], bps[1]])
    assert "byteps #2" in text and "median of 2 rounds: 1.30 (1.20-1.40)" in text
    assert "median" not in report.train_table([ddp[0], dict(bps[0], round=1)])
    with pytest.raises(SystemExit):
        run.parse_args(["--rounds", "0"])


def test_trace_summary_reads_timelines(tmp_path):
    import types
    tl = Timeline(str(tmp_path), rank=0, size=2, start_step=0, end_step=5)
    tl.begin(1, "g", 1.0)
    h = types.SimpleNamespace(id=1, error=None, out=types.SimpleNamespace(nbytes=8))
    t = types.SimpleNamespace(handle=h, part=0, nbytes=8, server=0, sent_at=1.25)
    tl.acked(t, 1.5)
    tl.part_done(t, 2.0, 2.001)
    tl.handle_done(h, 2.001)
    tl.write()
    s = report.trace_summary(tmp_path)
    assert s["ranks"] == 1 and s["partitions"] == 1
    assert s["stage_ms"]["queue"] == pytest.approx(250.0)
    assert s["stage_ms"]["push"] == pytest.approx(250.0)
    assert s["stage_ms"]["server+pull"] == pytest.approx(500.0)
    assert "server+pull" in report.trace_table({"x": s})


def test_cli_validation(capsys):
    for bad in (["--systems", "mpi"], ["--rates", "fast"], ["--workers", "0"],
                ["--env", "NOEQUALS"], ["--tcp-cc", "cubic;reboot"]):
        with pytest.raises(SystemExit):
            run.parse_args(bad)
    a = run.parse_args(["--rates", "1gbit,100mbit", "--workers", "2,4"])
    assert a.rates == ["1gbit", "100mbit"] and a.workers == [2, 4]
    assert "byteps-nomarks" in a.systems       # the loop without step_done(), by default
    # a new folder per run under benchmarks/results/, named by date and content
    assert a.out.parent == run.ROOT / "benchmarks" / "results"
    assert a.out.name.endswith("-cluster-1gbit-100mbit-w2-4-2ms"), a.out.name


# ------------------------------------------------------------------ real namespaces (root)
@pytest.mark.root
@pytest.mark.timeout(90)
@pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces); CI runs as root")
def test_two_namespaces_end_to_end(tmp_path):
    """Shaped link really limits TCP; byteps runs across namespaces; nothing is left."""
    out = tmp_path / "out"
    rc = run.main(["--rates", "100mbit", "--workers", "2", "--slow-size-mb", "2",
                   "--iters", "2", "--warmup", "1", "--probe-seconds", "1.5",
                   "--systems", "byteps-coloc", "--servers", "1", "--out", str(out),
                   "--timeout", "60", "--tcp-cc", "reno"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["tcp_cc"] == "reno" and doc["kernel"]       # pinned in every host, recorded
    probe = doc["probes"]["100mbit"]
    assert 0.05 < probe["pair_Gbps"] <= 0.105, probe          # shaped to 100 Mbit/s
    (row,) = doc["rows"]
    assert row["system"] == "byteps-coloc" and row["workers"] == 2
    assert len(row["per_rank_median_s"]) == 2
    # 2 MB pushed and pulled through a 100 Mbit/s link: at least the link's time for
    # the half that leaves the host (0.08 s); far below the 60 s timeout
    assert 0.08 < row["time_s"] < 30
    assert doc["traces"]["byteps-coloc-100mbit-w2"]["ranks"] == 2
    mine = [n for n in netns.list_namespaces() if n.startswith(f"bpsc-{os.getpid()}-")]
    assert mine == []


@pytest.mark.root
@pytest.mark.timeout(60)
@pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces); CI runs as root")
def test_cleanup_removes_leftovers_of_dead_runs():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    plan = Plan(1, f"bpsc-{dead.pid}-dead")
    netns.run_cmds(plan.setup_commands())
    try:
        assert plan.switch in netns.list_namespaces()
        gone = netns.cleanup()
        assert set(gone) >= {plan.switch, plan.hosts[0].ns}
        assert not set(gone) & {n for n in netns.list_namespaces()}
    finally:
        netns.run_cmds(plan.teardown_commands(), check=False)


def test_qdisc_stats_and_drop_column():
    text = ("qdisc tbf 8001: root refcnt 2 rate 1Gbit burst 1250000b lat 50ms\n"
            " Sent 123456 bytes 100 pkt (dropped 3, overlimits 7 requeues 0)\n"
            " backlog 0b 0p requeues 0\n"
            "qdisc tbf 8002: root\n Sent 10 bytes 20 pkt (dropped 1, overlimits 0 requeues 0)\n")
    assert netns.parse_qdisc_stats(text) == (120, 4)
    assert netns.parse_qdisc_stats("") == (0, 0)
    row = dict(report.make_row("gloo", "1gbit", 2, 2, _recs("gloo", 2, 1.0)),
               link_drops={"packets": 400, "dropped": 2})
    assert report.drop_pct(row) == pytest.approx(0.5)
    assert "0.50" in report.table([row], {})


@pytest.mark.root
@pytest.mark.timeout(90)
@pytest.mark.skipif(not IS_ROOT, reason="needs root (network namespaces); CI runs as root")
@pytest.mark.parametrize("sig", [2, 15])          # SIGINT (Ctrl-C), SIGTERM
def test_interrupted_run_tears_everything_down(sig, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cluster.run", "--rates", "100mbit", "--workers",
         "2", "--systems", "gloo", "--slow-size-mb", "50", "--iters", "50",
         "--probe-seconds", "20", "--out", str(tmp_path)],
        cwd=jobs.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONPATH=str(jobs.ROOT)))
    prefix = f"bpsc-{proc.pid}-"
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:   # wait until the probe runs inside the hosts
            ours = [n for n in netns.list_namespaces() if n.startswith(prefix)]
            if len(ours) == 3 and any(netns.namespace_pids(n) for n in ours):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the cluster did not come up")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out
    assert [n for n in netns.list_namespaces() if n.startswith(prefix)] == [], out

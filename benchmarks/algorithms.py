"""Training algorithms on an emulated cluster: time to a target accuracy and samples/s.

    sudo .venv/bin/python -m benchmarks.algorithms                       # the full run
    sudo .venv/bin/python -m benchmarks.algorithms --epochs 4 --scenarios straggler  # smoke
    sudo .venv/bin/python -m benchmarks.algorithms --cleanup             # remove leftovers

W worker hosts (default 4) and one server host (which also runs the scheduler) are
network namespaces on one bridge (benchmarks/cluster/netns.py).  Each algorithm trains
the digits MLP (benchmarks/algorithms_worker.py, numpy, 64-H-H-10) for the same number of
epochs per worker, in each scenario:

* ``straggler``: every link shaped with tc tbf (``--rate``); the last worker sleeps in
  every step as long as its own median step took (2x slower);
* ``latency``: added latency in user space (no ``netem`` in this kernel): every
  worker->server and worker->worker TCP connection goes through a forwarding proxy
  (benchmarks/cluster/delay_proxy.py) that holds every chunk ``--delay-ms`` one way
  (round trip + 2x that).  Services listen on per-host addresses that the clients' own
  namespaces route to the proxy (AnyIP), so the proxy hop replaces the bridge and the
  links are not rate-limited in this scenario; no straggler.

Algorithms: ``sync`` (SyncPS), ``async`` (AsyncPS, BYTEPS_ASYNC_STALENESS=2), ``shift_one``
(Decentralized), ``average`` (AsyncModelAverage, ``--interval-ms``); on request
(``--algos``) also ``async_unbounded`` (AsyncPS without a staleness bound), ``all``
(Decentralized all) and ``lowp`` (LowPrecisionDecentralized).  Reports, per scenario
and algorithm: total samples/s (sum of the workers' own rates), the time rank 0 took to
reach ``--target`` test accuracy (its own model), the final accuracy after ``finish()``;
a table on stdout, results.json, table.txt and algorithms.png in a new folder
(benchmarks/results/algorithms-<UTC time>/ unless --out).  Torn down on exit and errors.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cluster import jobs
from benchmarks.cluster.delay_proxy import anyip_commands
from benchmarks.cluster.netns import Cluster, NetnsError, Plan, cleanup, run_cmds

HERE = Path(__file__).resolve().parent
ALGOS = ("sync", "async", "shift_one", "average")
EXTRA = ("async_unbounded", "all", "lowp")        # by --algos only
SCENARIOS = ("straggler", "latency")
VSUBNET = "10.213.1"
PORTS = {"scheduler": 9100, "server": 9300, "peer": 9500}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks.algorithms", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--rate", default="1gbit", help="tbf rate of every link (straggler)")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="proxy delay, one way")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--target", type=float, default=0.88)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cleanup", action="store_true")
    return ap.parse_args(argv)


def vip(index: int) -> str:
    return f"{VSUBNET}.{10 + index}"


def latency_setup(plan: Plan, nworkers: int) -> list[list[str]]:
    """Per-host service addresses on lo; in every worker namespace the others' addresses
    are local (AnyIP) so that the proxy listens for them there."""
    hosts = plan.hosts
    cmds = [["ip", "-n", h.ns, "addr", "add", f"{vip(h.index)}/32", "dev", "lo"]
            for h in hosts]
    for g in hosts[:nworkers]:
        cmds += anyip_commands(g.ns, [vip(h.index) for h in hosts if h.index != g.index])
    return cmds


def proxy_links(plan: Plan, nworkers: int, run: int) -> list[dict]:
    hosts = plan.hosts
    server = hosts[nworkers]
    links = []
    for g in hosts[:nworkers]:
        links.append({"listen_ns": g.ns, "ip": vip(server.index),
                      "port": PORTS["server"] + run, "target_ns": server.ns})
        for w in hosts[:nworkers]:
            if w.index != g.index:
                links.append({"listen_ns": g.ns, "ip": vip(w.index),
                              "port": PORTS["peer"] + run, "target_ns": w.ns})
    return links


def job_specs(plan: Plan, a, algo: str, scenario: str, run: int) -> list:
    hosts = plan.hosts
    workers, server = hosts[:a.workers], hosts[a.workers]
    argv = [sys.executable, str(HERE / "algorithms_worker.py"), "--algo", algo,
            "--epochs", a.epochs, "--hidden", a.hidden, "--interval-ms", a.interval_ms,
            "--straggler-rank", a.workers - 1 if scenario == "straggler" else -1]
    env = {"BYTEPS_ENABLE_IPC": 0, "BYTEPS_SERVER_PORT": PORTS["server"] + run,
           "BYTEPS_PEER_PORT": PORTS["peer"] + run, "BYTEPS_HEARTBEAT_TIMEOUT": 30}
    if algo == "async":
        env["BYTEPS_ASYNC_STALENESS"] = 2
    specs = jobs.byteps_job(workers, [server], server, [str(x) for x in argv],
                            PORTS["scheduler"] + run, env)
    if scenario == "latency":      # services on the per-host addresses the proxy serves
        for s in specs:
            if s.env.get("DMLC_ROLE") in ("server", "worker"):
                s.env["DMLC_NODE_HOST"] = vip(s.host.index)
    return specs


def summarize(records: list[dict], target: float) -> dict:
    r0 = next(r for r in records if r["rank"] == 0)
    reach = next((t for t, acc in r0.get("curve", []) if acc >= target), None)
    return {"samples_per_s": sum(r["samples_per_s"] for r in records),
            "time_to_target_s": reach, "final_acc": r0["final_acc"],
            "train_s": max(r["seconds"] for r in records),
            "per_worker": {r["rank"]: round(r["samples_per_s"], 1) for r in records},
            "curve": r0.get("curve", [])}


def run_all(a) -> dict:
    algos = [x for x in a.algos.split(",") if x]
    scenarios = [x for x in a.scenarios.split(",") if x]
    bad = [x for x in algos if x not in ALGOS + EXTRA] + [
        x for x in scenarios if x not in SCENARIOS]
    if bad:
        raise SystemExit(f"unknown algorithm/scenario {bad}; choose from {ALGOS + EXTRA} / "
                         f"{SCENARIOS}")
    plan = Plan.new(a.workers + 1)
    out: dict = {"config": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(a).items()}, "results": {}}
    run = 0
    with Cluster(plan) as cluster:
        for scenario in scenarios:
            if scenario == "straggler":
                cluster.shape(a.rate)
            else:
                cluster.shape(None)
                run_cmds(latency_setup(plan, a.workers))
            for algo in algos:
                run += 1
                proxy = None
                try:
                    if scenario == "latency":
                        links = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
                        json.dump(proxy_links(plan, a.workers, run), links)
                        links.close()
                        proxy = subprocess.Popen([sys.executable, "-m",
                                                  "benchmarks.cluster.delay_proxy",
                                                  links.name, str(a.delay_ms)],
                                                 cwd=jobs.ROOT, stdout=subprocess.DEVNULL)
                        time.sleep(1.0)
                    t0 = time.monotonic()
                    outcomes = jobs.run_specs(plan, job_specs(plan, a, algo, scenario, run),
                                              a.timeout)
                    res = summarize(jobs.collect(outcomes), a.target)
                    res["wall_s"] = time.monotonic() - t0
                finally:
                    if proxy is not None:
                        proxy.kill()
                        proxy.wait(10)
                out["results"].setdefault(scenario, {})[algo] = res
                print(f"{scenario:9s} {algo:16s} {res['samples_per_s']:8.1f} samples/s  "
                      f"target {_fmt(res['time_to_target_s'])}  final acc "
                      f"{res['final_acc']:.3f}", flush=True)
    return out


def _fmt(v) -> str:
    return "not reached" if v is None else f"{v:.1f} s"


def table(doc: dict) -> str:
    lines = [f"{'scenario':10s} {'algorithm':16s} {'samples/s':>10s} {'vs sync':>8s} "
             f"{'time to ' + str(doc['config']['target']):>16s} {'final acc':>9s}"]
    for scenario, res in doc["results"].items():
        base = res.get("sync", {}).get("samples_per_s")
        for algo, r in res.items():
            ratio = f"{r['samples_per_s'] / base:.2f}x" if base else "-"
            lines.append(f"{scenario:10s} {algo:16s} {r['samples_per_s']:10.1f} {ratio:>8s} "
                         f"{_fmt(r['time_to_target_s']):>16s} {r['final_acc']:9.3f}")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scen = list(doc["results"])
    fig, axes = plt.subplots(2, len(scen), figsize=(6 * len(scen), 8), squeeze=False)
    for j, s in enumerate(scen):
        res = doc["results"][s]
        ax = axes[0][j]
        ax.bar(list(res), [r["samples_per_s"] for r in res.values()])
        ax.set_title(f"{s}: samples/s ({doc['config']['workers']} workers, total)")
        ax = axes[1][j]
        for algo, r in res.items():
            if r["curve"]:
                t, acc = zip(*r["curve"])
                ax.plot(t, acc, label=algo)
        ax.axhline(doc["config"]["target"], color="grey", linestyle=":")
        ax.set_xlabel("seconds (rank 0)")
        ax.set_ylabel("test accuracy (rank 0's model)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cleanup:
        print("removed:", cleanup(include_live=False))
        return 0
    out_dir = a.out or HERE / "results" / time.strftime("algorithms-%Y%m%dT%H%M%SZ",
                                                         time.gmtime())
    try:
        doc = run_all(a)
    except (NetnsError, jobs.JobError) as exc:
        print(f"benchmarks.algorithms: {exc}", file=sys.stderr)
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    text = table(doc)
    print(text)
    (out_dir / "table.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1))
    plot(doc, out_dir / "algorithms.png")
    print(f"wrote {out_dir}/results.json, table.txt, algorithms.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

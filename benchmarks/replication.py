"""Cost of server replication (BYTEPS_SERVER_REPLICAS=1) on push_pull throughput, loopback.

    .venv/bin/python benchmarks/replication.py [--sizes-mb 1,16] [--iters 20] [--repeats 3]
                                               [--workers 2] [--servers 2] [--async]
                                               [--cluster 1gbit]
                                               [--json results/replication.json]

Runs the same job (``bpslaunch --standalone``, W workers and S servers on this machine)
with BYTEPS_SERVER_REPLICAS=0 and =1, alternating, ``--repeats`` times each, and prints
the median time per push_pull and the algorithmic throughput (tensor bytes / time) of each,
with the ratio.  With replication every finished round also travels from its server to
the backup server and is confirmed before the pulls are answered (one extra copy of the
result per round and one extra round trip on the critical path); ``--async`` measures
asynchronous keys instead (every push is forwarded).  Loopback numbers: every process shares
the CPUs, so the extra copy costs CPU as much as bandwidth; say how busy the machine was.
``--cluster RATE`` (root) runs every worker and every server on its own emulated host
(network namespaces, benchmarks/cluster, links shaped to RATE): the copies then cross the
servers' links as they would on a cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = r'''
import json, os, sys, time, numpy as np
import byteps.numpy as bps
from byteps.core import api
sizes, iters, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
asyn = os.environ.get("BYTEPS_ENABLE_ASYNC") == "1"
bps.init()
res = {}
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    api.push_pull(x, f"b{nbytes}", out=x, average=not asyn, asynchronous=asyn)   # warm-up
    bps.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        api.push_pull(x, f"b{nbytes}", out=x, average=not asyn, asynchronous=asyn)
    res[str(nbytes)] = (time.perf_counter() - t0) / iters
    bps.barrier()
if bps.rank() == 0:
    json.dump(res, open(out, "w"))
'''


def run_once(sizes: list[int], iters: int, workers: int, servers: int, replicas: int,
             asyn: bool, timeout: float, cluster: str | None = None) -> dict:
    knobs = dict(BYTEPS_ENABLE_IPC="0", BYTEPS_SERVER_REPLICAS=str(replicas),
                 BYTEPS_ENABLE_ASYNC=str(int(asyn)), BYTEPS_AUTOTUNE="0")
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "w.py", Path(tmp) / "out.json"
        script.write_text(WORKER)
        argv = [sys.executable, str(script), json.dumps(sizes), str(iters), str(out)]
        if cluster:
            _on_cluster(argv, workers, servers, cluster, knobs, timeout)
        else:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DMLC_", "BYTEPS_"))}
            env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **knobs)
            cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--num-workers",
                   str(workers), "--hosts", str(workers), "--num-servers", str(servers),
                   *argv]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                               cwd=ROOT)
            if r.returncode != 0:
                raise SystemExit(f"job failed (replicas={replicas}): rc {r.returncode}\n"
                                 f"{r.stderr[-3000:]}")
        if not out.exists():
            raise SystemExit(f"job (replicas={replicas}) wrote no result")
        return {int(k): v for k, v in json.loads(out.read_text()).items()}


def _on_cluster(argv: list[str], workers: int, servers: int, rate: str, knobs: dict,
                timeout: float) -> None:
    """Workers and servers each on their own emulated host; the scheduler with server 0."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.cluster import jobs, netns
    plan = netns.Plan.new(workers + servers)
    with netns.Cluster(plan) as c:
        c.shape(rate, latency_ms=50.0, burst_ms=2.0)
        h = plan.hosts
        specs = jobs.byteps_job(h[:workers], h[workers:], h[workers], argv, 9200, knobs)
        jobs.run_specs(plan, specs, timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="1,16", help="tensor sizes in MB (comma separated)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--async", dest="asyn", action="store_true")
    ap.add_argument("--cluster", metavar="RATE", help="emulated hosts, links shaped to RATE "
                    "(e.g. 1gbit; needs root)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    sizes = [int(float(s) * 1e6) // 4 * 4 for s in a.sizes_mb.split(",")]
    times: dict[int, dict[int, list]] = {0: {s: [] for s in sizes}, 1: {s: [] for s in sizes}}
    for _ in range(a.repeats):
        for rep in (0, 1):
            for s, t in run_once(sizes, a.iters, a.workers, a.servers, rep, a.asyn,
                                 a.timeout, a.cluster).items():
                times[rep][s].append(t)
    load = os.getloadavg()
    where = f"emulated hosts, {a.cluster} links" if a.cluster else "loopback"
    print(f"push_pull, {a.workers} workers, {a.servers} servers, {where}, "
          f"{'asynchronous' if a.asyn else 'synchronous'}, median of {a.repeats} runs x "
          f"{a.iters} iterations; load average {load[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'size':>8} | {'no replica ms':>13} | {'GB/s':>6} | {'replica ms':>10} | "
          f"{'GB/s':>6} | {'replica/none':>12}")
    rows = []
    for s in sizes:
        t0, t1 = statistics.median(times[0][s]), statistics.median(times[1][s])
        rows.append({"bytes": s, "none_s": t0, "replica_s": t1, "ratio": t1 / t0,
                     "none_runs": times[0][s], "replica_runs": times[1][s]})
        print(f"{s / 1e6:>6.1f}MB | {t0 * 1e3:>13.2f} | {s / t0 / 1e9:>6.3f} | "
              f"{t1 * 1e3:>10.2f} | {s / t1 / 1e9:>6.3f} | {t1 / t0:>12.2f}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"workers": a.workers, "servers": a.servers,
                                            "where": where,
                                            "async": a.asyn, "iters": a.iters,
                                            "load_average": load, "cpus": os.cpu_count(),
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

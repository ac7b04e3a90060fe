"""Local reduction benchmark: 2 emulated hosts x 2 local workers.

    .venv/bin/python benchmarks/local_reduce.py [--quick] [--json results/local_reduce.json]

Time per push_pull (slowest rank) with every worker pushing directly
(``BYTEPS_LOCAL_REDUCE=0``), with local reduction and one network client per
slice (``slice``) and with local rank 0 as the only network
client (``root``, the default); torch.distributed gloo all_reduce over the same 4
processes; and, measured in the same run, the physical limits on this
machine: one memcpy of the tensor and one one-way loopback TCP transfer of it.
Also prints the payload bytes each host sends to the servers per push_pull.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # benchmarks.cluster and byteps from this checkout
    sys.path.insert(0, str(ROOT))
HOSTS, LOCAL = 2, 2
WORKER = r'''
import json, sys, time, numpy as np
import byteps.numpy as bps
from byteps.core import api
sizes, iters, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bps.init()
res = {}
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    n = max(3, min(iters, int(1e9 // max(nbytes, 1) // 4)))
    api.push_pull(x, f"b{nbytes}", out=x)          # warm-up: shared buffers, declarations
    bps.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        api.push_pull(x, f"b{nbytes}", out=x)
    res[str(nbytes)] = (time.perf_counter() - t0) / n
small = [np.ones(4096, np.float32) for _ in range(100)]
for rep in range(3):
    bps.barrier()
    t0 = time.perf_counter()
    hs = [api.push_pull_async(a, f"s{i}", out=a, priority=-i) for i, a in enumerate(small)]
    for h in hs:
        api.synchronize(h)
    res["small100"] = time.perf_counter() - t0
if out == "-":
    print("CLUSTER_RESULT " + json.dumps(dict(res, rank=bps.rank())), flush=True)
else:
    with open(f"{out}.{bps.rank()}", "w") as f:
        json.dump(res, f)
bps.shutdown()
'''
GLOO = r'''
import json, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
sizes, iters, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
res = {}
for nbytes in sizes:
    x = torch.ones(nbytes // 4)
    n = max(3, min(iters, int(1e9 // max(nbytes, 1) // 4)))
    dist.all_reduce(x); dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    res[str(nbytes)] = (time.perf_counter() - t0) / n
small = [torch.ones(4096) for _ in range(100)]
for rep in range(3):
    dist.barrier()
    t0 = time.perf_counter()
    for w in [dist.all_reduce(a, async_op=True) for a in small]:
        w.wait()
    res["small100"] = time.perf_counter() - t0
if out == "-":
    print("CLUSTER_RESULT " + json.dumps(dict(res, rank=dist.get_rank())), flush=True)
else:
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump(res, f)
dist.destroy_process_group()
'''


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    e.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return e


def slowest(prefix: Path, n: int) -> dict:
    docs = [json.loads(Path(f"{prefix}.{r}").read_text()) for r in range(n)]
    return {k: max(d[k] for d in docs) for k in docs[0]}


def run_byteps(mode: str, sizes, iters, tmp: Path, servers: int) -> dict:
    out = tmp / f"bps_{mode}"
    script = tmp / "bps_worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--hosts", str(HOSTS),
           "--local-size", str(LOCAL), "-s", str(servers), sys.executable, str(script),
           json.dumps(sizes), str(iters), str(out)]
    subprocess.run(cmd, env=env(BYTEPS_LOCAL_REDUCE=mode), check=True, timeout=1800)
    return slowest(out, HOSTS * LOCAL)


def run_gloo(sizes, iters, tmp: Path) -> dict:
    from byteps.launcher import free_port
    out, script, port = tmp / "gloo", tmp / "gloo_worker.py", str(free_port())
    script.write_text(GLOO)
    w = HOSTS * LOCAL
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(sizes), str(iters),
                               str(out)], env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                                  RANK=str(r), WORLD_SIZE=str(w)))
             for r in range(w)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError("gloo benchmark failed")
    return slowest(out, w)


def run_netns(rate: str, sizes, iters, tmp: Path, servers: int) -> dict:
    """The same jobs on emulated hosts (network namespaces) whose links tc shapes to ``rate``:
    one bpslaunch per worker host with --local-size, servers on their own hosts."""
    from benchmarks.cluster import jobs
    from benchmarks.cluster.netns import Cluster, Plan
    from byteps.launcher import free_port
    (tmp / "bps_worker.py").write_text(WORKER)
    (tmp / "gloo_worker.py").write_text(GLOO)
    plan = Plan.new(HOSTS + servers)
    out = {}
    py = sys.executable
    with Cluster(plan) as cluster:
        cluster.shape(rate)
        workers, srv = plan.hosts[:HOSTS], plan.hosts[HOSTS:]
        for mode in ("0", "slice", "root"):
            specs = jobs.byteps_job(workers, srv, srv[0],
                                    ["--local-size", str(LOCAL), py, str(tmp / "bps_worker.py"),
                                     json.dumps(sizes), str(iters), "-"], free_port(),
                                    {"BYTEPS_LOCAL_REDUCE": mode, "BYTEPS_NUMA_ON": "0"})
            out[mode] = _slowest_records(jobs.collect(jobs.run_specs(plan, specs, 1800)))
        port = free_port()
        specs = [jobs.Spec(f"gloo rank {h * LOCAL + lr}", workers[h],
                           [py, str(tmp / "gloo_worker.py"), json.dumps(sizes), str(iters), "-"],
                           jobs.base_env(RANK=h * LOCAL + lr, WORLD_SIZE=HOSTS * LOCAL,
                                         MASTER_ADDR=workers[0].ip, MASTER_PORT=port,
                                         GLOO_SOCKET_IFNAME=workers[h].dev))
                 for h in range(HOSTS) for lr in range(LOCAL)]
        out["gloo"] = _slowest_records(jobs.collect(jobs.run_specs(plan, specs, 1800)))
    return out


def _slowest_records(recs: list[dict]) -> dict:
    if len(recs) != HOSTS * LOCAL:
        raise RuntimeError(f"expected {HOSTS * LOCAL} result records, got {len(recs)}")
    return {k: max(r[k] for r in recs) for k in recs[0] if k != "rank"}


def memcpy_s(nbytes: int) -> float:
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return best


def tcp_s(nbytes: int, reps: int = 3) -> float:
    """One-way loopback TCP transfer of nbytes with pyzmq (the push_pull benchmark's limit)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from push_pull import raw_zmq
    return raw_zmq(nbytes, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--netns", metavar="RATE", help="run on emulated hosts (network namespaces, "
                    "needs root) with links shaped to RATE, e.g. 1gbit")
    ap.add_argument("--json", default=str(ROOT / "results" / "local_reduce.json"))
    args = ap.parse_args()
    sizes = [4 << 10, 256 << 10, 4 << 20, 16 << 20] + ([] if args.quick else [64 << 20])
    iters = 5 if args.quick else 20
    res = {"hosts": HOSTS, "local_size": LOCAL, "servers": args.servers, "sizes": sizes,
           "cpus": os.cpu_count(), "modes": {}, "limits": {}}
    res["netns_rate"] = args.netns
    for n in sizes:
        res["limits"][str(n)] = {"memcpy_s": memcpy_s(n), "tcp_s": tcp_s(n)}
        if args.netns:   # the busiest link: the servers' (one push + one pull per host)
            from benchmarks.cluster.netns import rate_bps
            res["limits"][str(n)]["tcp_s"] = HOSTS * n * 8 / rate_bps(args.netns) / args.servers
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.netns:
            res["modes"] = run_netns(args.netns, sizes, iters, tmp, args.servers)
        else:
            for mode in ("0", "slice", "root"):
                res["modes"][mode] = run_byteps(mode, sizes, iters, tmp, args.servers)
            res["modes"]["gloo"] = run_gloo(sizes, iters, tmp)
    m = res["modes"]
    where = f"links shaped to {args.netns} (netns)" if args.netns else "loopback"
    print(f"\n{HOSTS} emulated hosts x {LOCAL} local workers, {args.servers} server(s), "
          f"{os.cpu_count()} CPUs, {where}; ms per push_pull of the slowest rank")
    print("tcp 1-way: loopback transfer of the tensor; with --netns: the servers' link "
          "carrying one locally reduced tensor per host (the limit of 'slice')")
    print(f"{'size':>8} {'direct':>8} {'slice':>8} {'root':>8} {'gloo':>8} "
          f"{'direct/slice':>12} {'direct/root':>11} {'gloo/slice':>10} {'memcpy':>7} "
          f"{'tcp 1-way':>9} {'host->srv KB direct/local':>26}")
    for n in sizes + ["small100"]:
        k = str(n)
        row = [m[x][k] * 1e3 for x in ("0", "slice", "root", "gloo")]
        lim = res["limits"].get(k, {})
        sz = f"{n >> 20} MB" if isinstance(n, int) and n >= 1 << 20 else \
            (f"{n >> 10} KB" if isinstance(n, int) else n)
        per_host = f"{LOCAL * n // 1024}/{n // 1024}" if isinstance(n, int) else \
            f"{LOCAL * 100 * 16}/{100 * 16}"
        print(f"{sz:>8} {row[0]:8.2f} {row[1]:8.2f} {row[2]:8.2f} {row[3]:8.2f} "
              f"{row[0] / row[1]:12.2f} {row[0] / row[2]:11.2f} {row[3] / row[1]:10.2f} "
              f"{lim.get('memcpy_s', 0) * 1e3:7.2f} {lim.get('tcp_s', 0) * 1e3:9.2f} "
              f"{per_host:>26}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

"""push_pull vs torch.distributed (gloo) all_reduce, with physical limits, in one run.

    .venv/bin/python benchmarks/push_pull.py [--quick] [--json results/push_pull.json]

Prints one table per (W, S) and writes JSON.  Limits measured in the same run:
raw ``np.add`` (summation) and a raw pyzmq loopback send loop (bytes moved).

Each size is its own byteps job, as a user whose model has that size runs it: one
warm-up push_pull, the **first steps** (the next ``iters``, while autotune still measures
and tries settings), then up to ``SETTLE`` more until autotune is done, then the
**steady state** (``iters`` more).  One job for every size would let autotune tune on the
smallest tensors and time the large ones during its trials.  gloo has no tuning: its
first and steady iterations are the ``iters`` after one warm-up and the ``iters`` after
those, in one job.
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
WORKER = r'''
import json, sys, time, numpy as np
import byteps.numpy as bps
from byteps.core import api
sizes, iters, out, settle = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
small_too = sys.argv[5] == "1"
bps.init()
res = {}


def timed(x, name, n):
    bps.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        api.push_pull(x, name, out=x, average=True)
    # seconds per op; CPU seconds (every thread of this worker) per GB moved (push + pull)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / (2 * x.nbytes * n / 1e9)


for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    n = max(2, min(iters, int(4e9 // max(nbytes, 1) // 8)))
    bps.push_pull(x, name=f"b{nbytes}")              # warm-up (declares, allocates)
    res[f"first{nbytes}"], res[f"firstcpu{nbytes}"] = timed(x, f"b{nbytes}", n)
    tu, k = api._STATE.tuner, 0
    # until autotune is done on every rank (agreed in a one-element sum, as cpu_per_byte.py)
    while k < settle and api.push_pull(np.array([0.0 if tu is None or tu.state == "done"
                                                 else 1.0]), "pp.tuning", average=False)[0]:
        k += 1
        api.push_pull(x, f"b{nbytes}", out=x, average=True)
    res[str(nbytes)], res[f"cpu{nbytes}"] = timed(x, f"b{nbytes}", n)
    res[f"settle{nbytes}"] = k
    res[f"partition{nbytes}"] = api.get_config().partition_bytes
# 200 small tensors submitted together (in one job of the run)
small = [np.ones(4096, np.float32) for _ in range(200)]
for rep in range(2 if small_too else 0):
    bps.barrier()
    t0 = time.perf_counter()
    hs = [api.push_pull_async(a, f"s{i}", out=a) for i, a in enumerate(small)]
    for h in hs:
        bps.synchronize(h)
    res["small200"] = time.perf_counter() - t0
if bps.rank() == 0:
    json.dump(res, open(out, "w"))
'''
GLOO = r'''
import json, os, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
sizes, iters, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
res = {}
for nbytes in sizes:
    x = torch.ones(nbytes // 4)
    n = max(2, min(iters, int(4e9 // max(nbytes, 1) // 8)))
    dist.all_reduce(x)
    for key in ("first", ""):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            dist.all_reduce(x)
        res[f"{key}{nbytes}"] = (time.perf_counter() - t0) / n
        w = dist.get_world_size()     # a ring sends and receives 2(w-1)/w of the tensor each
        res[f"{key}cpu{nbytes}"] = (time.process_time() - c0) / (4 * (w - 1) / w * nbytes * n / 1e9)
small = [torch.ones(4096) for _ in range(200)]
for rep in range(2):
    dist.barrier()
    t0 = time.perf_counter()
    works = [dist.all_reduce(a, async_op=True) for a in small]
    for w in works:
        w.wait()
    res["small200"] = time.perf_counter() - t0
if dist.get_rank() == 0:
    json.dump(res, open(out, "w"))
dist.destroy_process_group()
'''


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    e["PYTHONPATH"] = str(ROOT)
    e["OMP_NUM_THREADS"] = "1"
    return e


SETTLE = 60    # at most this many push_pulls for autotune to finish (it takes about 30)


def run_byteps(w: int, s: int, sizes, iters, tmp: Path) -> dict:
    """One job per size (module docstring); the last one also times 200 small tensors."""
    script = tmp / "bps_worker.py"
    script.write_text(WORKER)
    res: dict = {}
    for nbytes in sizes:
        out = tmp / f"bps_{w}_{s}_{nbytes}.json"
        cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "-n", str(w),
               "--hosts", str(w), "-s", str(s), sys.executable, str(script),
               json.dumps([nbytes]), str(iters), str(out), str(SETTLE),
               "1" if nbytes == sizes[-1] else "0"]
        subprocess.run(cmd, env=env(), check=True, timeout=1800)
        res.update(json.loads(out.read_text()))
    return res


def run_gloo(w: int, sizes, iters, tmp: Path) -> dict:
    out = tmp / f"gloo_{w}.json"
    script = tmp / "gloo_worker.py"
    script.write_text(GLOO)
    from byteps.launcher import free_port
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(sizes), str(iters),
                               str(out)],
                              env=dict(env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                       RANK=str(r), WORLD_SIZE=str(w)))
             for r in range(w)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError("gloo benchmark failed")
    return json.loads(out.read_text())


def raw_np_add(nbytes: int) -> float:
    """Seconds for one out-of-place np.add over nbytes of float32 (the server's work)."""
    a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    out = np.empty_like(a)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        np.add(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return best


def server_sum(nbytes: int, workers: int) -> float:
    """Seconds the server's store.apply needs per worker push of nbytes (same code path)."""
    from byteps.server.store import Slot, apply
    from byteps.transport.wire import PULL, PUSH, Entry
    arrs = [np.ones(nbytes // 4, np.float32) for _ in range(workers)]
    best = 1e9
    slot = Slot(1, 0, 0, nbytes // 4, -1)     # steady state: result buffers are reused
    for rnd in range(6):
        out: dict = {}
        t0 = time.perf_counter()
        for r, a in enumerate(arrs):
            apply(slot, Entry(1, 0, rnd, PUSH | PULL, 0, a.size), a, r, b"w%d" % r, workers, out)
        if rnd:
            best = min(best, (time.perf_counter() - t0) / (workers - 1))
    return best


def raw_zmq(nbytes: int, reps: int = 5) -> float:
    """Seconds to move nbytes one way over loopback TCP with pyzmq (zero-copy send)."""
    import threading

    import zmq
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    buf = np.ones(nbytes // 4, np.float32)

    def rx():
        for _ in range(reps + 1):
            b.recv(copy=False)
            b.send(b"k")
    t = threading.Thread(target=rx)
    t.start()
    a.send(buf, copy=False)
    a.recv()
    t0 = time.perf_counter()
    for _ in range(reps):
        a.send(buf, copy=False)
        a.recv()
    dt = (time.perf_counter() - t0) / reps
    t.join()
    a.close(0)
    b.close(0)
    ctx.term()
    return dt


def fmt_size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    ap.add_argument("--configs", default="2x2,4x4", help="WxS list")
    ap.add_argument("--json", default=str(ROOT / "results" / "push_pull.json"))
    args = ap.parse_args()
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 100 << 20] + ([] if args.quick else [256 << 20])
    iters = 5 if args.quick else 10
    results = {"sizes": sizes, "configs": {}, "limits": {}}
    for n in sizes:
        results["limits"][str(n)] = {"np_add_s": raw_np_add(n), "zmq_s": raw_zmq(n, 3),
                                     "server_sum_s": server_sum(n, 2)}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for cfg in args.configs.split(","):
            w, s = map(int, cfg.split("x"))
            bps = run_byteps(w, s, sizes, iters, tmp)
            gloo = run_gloo(w, sizes, iters, tmp)
            results["configs"][cfg] = {"byteps": bps, "gloo": gloo}
            print(f"\nW={w} S={s}  (time per op, steady state; ratio > 1 means byteps is "
                  "faster; first: the first steps, autotune still trying settings)")
            print(f"{'size':>8} {'byteps ms':>10} {'gloo ms':>9} {'gloo/bps':>9} "
                  f"{'first bps':>10} {'gloo':>7} {'ratio':>6} "
                  f"{'zmq 1-way ms':>13} {'np.add ms':>10} {'srv sum/np.add':>15} "
                  f"{'CPU s/GB bps':>13} {'gloo':>6} {'partition':>10}")
            for n in sizes:
                lim = results["limits"][str(n)]
                b, g = bps[str(n)], gloo[str(n)]
                fb, fg = bps[f"first{n}"], gloo[f"first{n}"]
                print(f"{fmt_size(n):>8} {b * 1e3:10.2f} {g * 1e3:9.2f} {g / b:9.2f} "
                      f"{fb * 1e3:10.2f} {fg * 1e3:7.2f} {fg / fb:6.2f} "
                      f"{lim['zmq_s'] * 1e3:13.2f} {lim['np_add_s'] * 1e3:10.2f} "
                      f"{lim['np_add_s'] / lim['server_sum_s']:15.2f} "
                      f"{bps[f'cpu{n}']:13.2f} {gloo[f'cpu{n}']:6.2f} "
                      f"{fmt_size(bps[f'partition{n}']):>10}")
            b, g = bps["small200"], gloo["small200"]
            print(f"{'200x16KB':>8} {b * 1e3:10.2f} {g * 1e3:9.2f} {g / b:9.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

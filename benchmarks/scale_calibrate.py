"""Measure the per-message and per-byte CPU costs of the byteps data path on this machine.

    .venv/bin/python benchmarks/scale_calibrate.py [--mb 32] [--iters 6] \
        [--json benchmarks/results/scale_calibration.json]

Inputs for ``benchmarks/scale_model.py``.  One ``bpslaunch --standalone -n 1 -s 1`` job per
partition size pushes and pulls the same tensor (``--mb``) through the real worker engine and
server over loopback TCP (``BYTEPS_ENABLE_IPC=0``: no shared memory, every byte through ZeroMQ
and the kernel, as between hosts).  The credit window is held at a fixed number of bytes
(``BYTEPS_SCHEDULING_CREDIT`` = window / partition) and fusion is off, so the number of
messages is the only thing that changes; loopback is far faster than the links, so the time is
CPU.  A least-squares fit of

    t_op = n_messages * a_msg + bytes * b_byte

gives the per-message cost ``a_msg`` (one partition's push + ack + pull through worker and
server) and the per-byte cost ``b_byte`` (of the whole round trip of one byte: send, receive,
sum, send back, receive, copy out).  ``np.add`` throughput (the server's summation) is measured
alongside.  W = 1, S = 1: three processes (scheduler, server, worker) on this machine's cores.
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
nbytes, iters, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bps.init()
x = np.ones(nbytes // 4, np.float32)
api.push_pull(x, "calib", out=x, average=True)          # warm-up: declare, allocate
api.push_pull(x, "calib", out=x, average=True)
ts = []
c0 = time.process_time()
for _ in range(iters):
    t0 = time.perf_counter()
    api.push_pull(x, "calib", out=x, average=True)
    ts.append(time.perf_counter() - t0)
cpu = time.process_time() - c0
json.dump({"times": ts, "worker_cpu_s": cpu / iters}, open(out, "w"))
'''


def env(part: int, window: int) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    e.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", BYTEPS_ENABLE_IPC="0",
             BYTEPS_PARTITION_BYTES=str(part), BYTEPS_FUSION_BYTES="0",
             BYTEPS_SCHEDULING_CREDIT=str(max(1, window // part)),
             BYTEPS_RESEND_TIMEOUT_S="30", BYTEPS_LOG_LEVEL="WARNING")
    return e


def run_one(nbytes: int, part: int, window: int, iters: int, tmp: Path) -> dict:
    script = tmp / "calib_worker.py"
    script.write_text(WORKER)
    out = tmp / f"calib_{part}.json"
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "-n", "1", "-s", "1",
           sys.executable, str(script), str(nbytes), str(iters), str(out)]
    subprocess.run(cmd, env=env(part, window), check=True, timeout=600,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def np_add_Bps(nbytes: int = 64 << 20) -> float:
    """Bytes of output per second of one out-of-place float32 np.add (best of 7)."""
    a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    out = np.empty_like(a)
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        np.add(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def fit(points: list[dict]) -> tuple[float, float, float]:
    """Least squares t = n*a + bytes*b over the fastest iteration of each size (other jobs only
    ever add time); returns a, b and the max relative residual."""
    A = np.array([[p["messages"], p["bytes"]] for p in points], float)
    t = np.array([p["min_s"] for p in points], float)     # CPU cost: the least-disturbed run
    # scale columns for conditioning, then solve
    s = A.max(axis=0)
    coef, *_ = np.linalg.lstsq(A / s, t, rcond=None)
    a, b = np.maximum(coef / s, 0.0)
    pred = A @ np.array([a, b])
    return float(a), float(b), float(np.max(np.abs(pred - t) / t))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=32.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--window-mb", type=float, default=16.0)
    ap.add_argument("--parts", default="32768,65536,131072,262144,524288,1048576,2097152,4096000")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/scale_calibration.json"))
    a = ap.parse_args(argv)
    nbytes = int(a.mb * 1e6) // 4 * 4
    window = int(a.window_mb * 1e6)
    points = []
    with tempfile.TemporaryDirectory() as d:
        for part in [int(p) for p in a.parts.split(",")]:
            r = run_one(nbytes, part, window, a.iters, Path(d))
            msgs = -(-nbytes // part)
            t = float(np.median(r["times"]))
            points.append({"partition_bytes": part, "messages": msgs, "bytes": nbytes,
                           "time_s": t, "min_s": min(r["times"]),
                           "worker_cpu_s": r["worker_cpu_s"]})
            print(f"partition {part:>8d} B  {msgs:5d} msgs  {t * 1e3:8.1f} ms/op  "
                  f"{nbytes / t / 1e6:7.1f} MB/s  worker CPU {r['worker_cpu_s'] * 1e3:7.1f} ms/op",
                  flush=True)
    a_msg, b_byte, resid = fit(points)
    add = np_add_Bps()
    res = {"machine": {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg(),
                       "when": time.strftime("%Y-%m-%d %H:%M:%S")},
           "args": vars(a), "points": points,
           "a_msg_s": a_msg, "b_byte_s": b_byte, "fit_max_rel_residual": resid,
           "np_add_Bps": add}
    print(f"per message a = {a_msg * 1e6:.1f} us   per byte b = {b_byte * 1e9:.3f} ns "
          f"({1 / b_byte / 1e6 if b_byte else float('inf'):.0f} MB/s)   max residual {resid:.1%}")
    print(f"np.add: {add / 1e9:.2f} GB/s of output   load average {os.getloadavg()}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

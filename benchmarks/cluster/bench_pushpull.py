"""One byteps worker of the cluster benchmark: push_pull one tensor ``warmup + iters``
times.

argv: size_bytes iters warmup [marks|nomarks].  Prints ``CLUSTER_RESULT {json}`` with the
time of every timed iteration (seconds), of every iteration from the first
(``all_times``, warm-up included), this worker's telemetry and its CPU seconds (every
thread of the process, the engine's included) over the timed iterations, with the bytes
it moved meanwhile (pushed + pulled).

``marks`` (the default): each push_pull is one step, marked with ``step_done()`` (what
every plugin's optimizer does); with autotune on (the default) the warm-up must cover
its trials (about 20 steps) for the timed iterations to run with the final choice.
``nomarks``: a numpy user's loop that never calls ``step_done()`` (autotune infers the
steps from the repeated name: byteps/core/autotune/names.py); run with ``warmup`` 2 it
measures from the 3rd step on, through autotune's trials.
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps.core import api as core


def servers_cpu() -> float:
    """CPU seconds (user + system, every thread) the job's servers used so far, from
    /proc (the emulated hosts share this machine's process table)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for srv in core._STATE.engine.server_info:
        st = open(f"/proc/{srv['pid']}/stat").read()
        f = st[st.rindex(")") + 2:].split()
        total += int(f[11]) + int(f[12])
    return total / tick


def main() -> None:
    nbytes, iters, warmup = (int(a) for a in sys.argv[1:4])
    marks = (sys.argv[4] if len(sys.argv) > 4 else "marks") == "marks"
    bps.init()
    x = np.full(max(1, nbytes // 4), float(bps.rank() + 1), dtype=np.float32)
    out = np.empty_like(x)
    every = []
    for _ in range(warmup):
        t = time.perf_counter()
        core.push_pull(x, "cluster.grad", average=True, out=out)
        every.append(time.perf_counter() - t)
        if marks:
            core.step_done()             # one training step (autotune counts these)
    bps.barrier()
    times = []
    cpu0 = time.process_time()
    srv0 = servers_cpu() if bps.rank() == 0 else None
    for _ in range(iters):
        t = time.perf_counter()
        core.push_pull(x, "cluster.grad", average=True, out=out)
        times.append(time.perf_counter() - t)
        if marks:
            core.step_done()
    cpu = time.process_time() - cpu0
    srv = None if srv0 is None else servers_cpu() - srv0
    n = bps.size()
    expect = (n + 1) / 2.0
    if not np.allclose(out[:1000], expect):
        raise SystemExit(f"rank {bps.rank()}: wrong result {out[:3]} (expected {expect})")
    tu = core._STATE.tuner
    print("CLUSTER_RESULT " + json.dumps({
        "system": "byteps", "rank": bps.rank(), "size": n, "bytes": int(x.nbytes),
        "times": times, "all_times": every + times, "marks": marks,
        "speed_MBps": core.get_pushpull_speed()[1], "cpu_s": cpu,
        "moved_bytes": 2 * int(x.nbytes) * iters, "warmup": warmup,
        # rank 0: every server's CPU over its timed iterations (W pushes in, W results out)
        "server_cpu_s": srv, "server_moved_bytes": 2 * n * int(x.nbytes) * iters,
        "config": {"partition_bytes": core.get_config().partition_bytes,
                   "credit_bytes": core.get_config().credit_bytes,
                   "autotune_state": None if tu is None else tu.state,
                   "autotune_steps": None if tu is None else tu.step,
                   "probe": None if tu is None else
                   [r[3:5] for r in tu.rows if r[2] == "probe"]}}), flush=True)
    bps.barrier()


if __name__ == "__main__":
    main()

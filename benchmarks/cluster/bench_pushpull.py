"""One byteps worker of the cluster benchmark: push_pull one tensor ``iters`` times.

argv: size_bytes iters warmup.  Prints ``CLUSTER_RESULT {json}`` with the
time of every timed iteration (seconds), this worker's telemetry and its CPU seconds
(every thread of the process, the engine's included) over the timed iterations, with the
bytes it moved meanwhile (pushed + pulled).  With autotune on (the default) the warm-up
must cover its trials (1 + 5 x BYTEPS_AUTOTUNE_STEPS = 16 steps; each push_pull is one
step here, marked with step_done()) for the timed iterations to run with the final
choice.
"""
import json
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps.core import api as core


def main() -> None:
    nbytes, iters, warmup = (int(a) for a in sys.argv[1:4])
    bps.init()
    x = np.full(max(1, nbytes // 4), float(bps.rank() + 1), dtype=np.float32)
    out = np.empty_like(x)
    for _ in range(warmup):
        core.push_pull(x, "cluster.grad", average=True, out=out)
        core.step_done()             # one training step (autotune counts these)
    bps.barrier()
    times = []
    cpu0 = time.process_time()
    for _ in range(iters):
        t = time.perf_counter()
        core.push_pull(x, "cluster.grad", average=True, out=out)
        times.append(time.perf_counter() - t)
        core.step_done()
    cpu = time.process_time() - cpu0
    n = bps.size()
    expect = (n + 1) / 2.0
    if not np.allclose(out[:1000], expect):
        raise SystemExit(f"rank {bps.rank()}: wrong result {out[:3]} (expected {expect})")
    print("CLUSTER_RESULT " + json.dumps({
        "system": "byteps", "rank": bps.rank(), "size": n, "bytes": int(x.nbytes),
        "times": times, "speed_MBps": core.get_pushpull_speed()[1], "cpu_s": cpu,
        "moved_bytes": 2 * int(x.nbytes) * iters, "warmup": warmup,
        "config": {"partition_bytes": core.get_config().partition_bytes,
                   "credit_bytes": core.get_config().credit_bytes}}), flush=True)
    bps.barrier()


if __name__ == "__main__":
    main()

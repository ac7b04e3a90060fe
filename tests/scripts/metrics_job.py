"""A worker that trains until told to stop (tests/test_metrics.py).

    metrics_job.py STOPFILE [MAX_S]    push_pull two tensors per step (numpy API,
                                       step_done() each step) until STOPFILE exists
                                       or MAX_S seconds (default 60) have passed on
                                       any rank; all ranks stop at the same step
"""
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

stop, max_s = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
bps.init()
a = np.ones(300_000, np.float32)
b = np.ones(1000, np.float32)
end = time.monotonic() + max_s
steps = 0
while True:
    # every rank stops at the same step (one rank's clock or view of the file decides)
    done = float(time.monotonic() >= end or os.path.exists(stop))
    if bps.push_pull(np.array([done], np.float32), name="stop", average=False)[0] > 0:
        break
    bps.push_pull(a, name="a")
    bps.push_pull(b, name="b")
    bps.step_done()
    steps += 1
    time.sleep(0.02)
print(f"rank {bps.rank()} done after {steps} steps", flush=True)
bps.shutdown()

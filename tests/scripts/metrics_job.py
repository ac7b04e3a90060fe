"""A worker that trains until told to stop (tests/test_metrics.py).

    metrics_job.py STOPFILE [MAX_S]    push_pull two tensors per step (numpy API,
                                       step_done() each step) until STOPFILE exists
                                       or MAX_S seconds (default 60) have passed
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
while time.monotonic() < end and not os.path.exists(stop):
    bps.push_pull(a, name="a")
    bps.push_pull(b, name="b")
    bps.step_done()
    steps += 1
    time.sleep(0.02)
print(f"rank {bps.rank()} done after {steps} steps", flush=True)
bps.shutdown()

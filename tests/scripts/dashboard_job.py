"""A worker for tests/test_dashboard.py: trains until told to stop; one rank may be slow to
compute, one may get stuck in a named function.

    dashboard_job.py FOLDER SLOW_RANK STUCK_RANK [MAX_S]

Every step: push_pull a stop flag (all ranks stop at the same step when FOLDER/stop exists
or MAX_S passed), push_pull two tensors, step_done(), 20 ms of "compute" (SLOW_RANK: 80 ms
more).  When FOLDER/stuck exists, STUCK_RANK calls ``stuck_here()``, which sleeps until
FOLDER/unstuck exists (at most 30 s), after writing the time it began to FOLDER/stuck_at.
"""
import os
import sys
import time

import numpy as np

import byteps.numpy as bps


def stuck_here(folder):
    with open(os.path.join(folder, "stuck_at"), "w") as f:
        f.write(repr(time.time()))
    end = time.monotonic() + 30
    while not os.path.exists(os.path.join(folder, "unstuck")) and time.monotonic() < end:
        time.sleep(0.2)


folder, slow, stuck = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_s = float(sys.argv[4]) if len(sys.argv) > 4 else 60.0
bps.init()
a = np.ones(100_000, np.float32)
b = np.ones(1000, np.float32)
end = time.monotonic() + max_s
steps, was_stuck = 0, False
while True:
    done = float(time.monotonic() >= end or os.path.exists(os.path.join(folder, "stop")))
    if bps.push_pull(np.array([done], np.float32), name="stop", average=False)[0] > 0:
        break
    if bps.rank() == stuck and not was_stuck and os.path.exists(os.path.join(folder, "stuck")):
        was_stuck = True
        stuck_here(folder)
    bps.push_pull(a, name="a")
    bps.push_pull(b, name="b")
    bps.step_done()
    steps += 1
    time.sleep(0.02 + (0.08 if bps.rank() == slow else 0.0))
print(f"rank {bps.rank()} done after {steps} steps", flush=True)
bps.shutdown()

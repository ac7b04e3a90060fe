"""A small worker for the bpslaunch tests (tests/test_launcher_cli.py).

    launcher_job.py hello              print rank and size, push_pull a few times
    launcher_job.py crash RANK STEP    RANK raises RuntimeError('boom') at STEP and then
                                       takes 3 s to tear down (like a torch process)
    launcher_job.py noinit RANK        RANK never calls init() (the job cannot form)
"""
import atexit
import sys
import time

import numpy as np

mode = sys.argv[1]
if mode == "crash":
    # registered before init(): runs after BytePS has told the scheduler (atexit is LIFO)
    atexit.register(time.sleep, 3.0)

import byteps.numpy as bps  # noqa: E402  (after the atexit registration)

if mode == "noinit" and int(sys.argv[2]) == int(__import__("os").environ["DMLC_WORKER_ID"]):
    time.sleep(600)
bps.init()
print(f"hello from rank {bps.rank()} of {bps.size()}", flush=True)
print(f"stderr of rank {bps.rank()}", file=sys.stderr, flush=True)
for step in range(30):
    if mode == "crash" and bps.rank() == int(sys.argv[2]) and step == int(sys.argv[3]):
        raise RuntimeError("boom")
    bps.push_pull(np.ones(8, np.float32), name="x")
    time.sleep(0.02)

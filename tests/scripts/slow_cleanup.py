"""Rank 0 SIGKILLs the last server at step 3; each worker's ``finally`` then takes 1 s
before it writes out_dir/cleanup<rank> (a checkpoint or a log flushed after the error):
bpslaunch must let the workers end by themselves before it SIGTERMs them.

argv: out_dir
"""
import os
import signal
import sys
import time

import numpy as np

import byteps.numpy as bps

out = sys.argv[1]
bps.init()
r = bps.rank()
error = "none"
try:
    for step in range(10000):
        if step == 3 and r == 0:
            from byteps.core import api
            os.kill(api._STATE.engine.server_info[-1]["pid"], signal.SIGKILL)
        bps.push_pull(np.ones(100000, np.float32), name="x")
        time.sleep(0.01)
except bps.BytePSError as exc:
    error = str(exc)
    raise
finally:
    time.sleep(1.0)
    with open(os.path.join(out, f"cleanup{r}"), "w") as f:
        f.write(error)

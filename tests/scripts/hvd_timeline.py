"""Worker script for Horovod's timeline (tests/test_hvd_timeline.py): a few collectives,
rank 0 reading the file while the job runs and after shutdown.

argv: out_dir path mode.  mode "env": HOROVOD_TIMELINE=path is set by the test; "api":
start_timeline(path, mark_cycles=True) after init, then stop_timeline() and a second
file path + ".2" for one more allreduce.  "env" ends with shutdown(), init() (as an
elastic re-form does) and one more allreduce.  Writes out_dir/rank<r>.json.
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
bps.init()
r = bps.rank()
if mode == "api":
    bps.start_timeline(path, mark_cycles=True)
bps.allreduce(np.ones(3, np.float32), name="small")
big = bps.push_pull(np.full(1_000_000, r + 1.0, np.float32), name="big", average=False)
gathered = bps.allgather(np.full((r + 1, 2), r, np.float32), name="gath")
bc = bps.broadcast(np.arange(4.0) * (r + 1), root_rank=1, name="bc")
time.sleep(0.3)
live = None
if r == 0:
    with open(path) as f:
        live = json.load(f)          # a valid JSON array while the job runs
second = None
if mode == "api":
    bps.stop_timeline()
    bps.start_timeline(path + ".2")
    bps.allreduce(np.ones(2, np.float32), name="after")
    bps.stop_timeline()
    if r == 0:
        with open(path + ".2") as f:
            second = json.load(f)
bps.shutdown()
if mode == "env":          # an elastic re-form's shutdown()/init(): the same file goes on
    bps.init()
    bps.allreduce(np.ones(2, np.float32), name="again")
    bps.shutdown()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"live": live, "second": second, "big": float(big[0]),
               "gathered": gathered.shape[0], "bc": bc.tolist(),
               "exists": os.path.exists(path)}, f)

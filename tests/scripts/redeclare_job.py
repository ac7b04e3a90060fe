"""Worker script: a tensor name re-used with new shapes (byteps/core/pipeline/redeclare.py).

    redeclare_job.py OUT_DIR mismatch    after a first use of "x" with shape (2,), rank 0
                                         re-uses it with shape (3,), rank 1 with (4,)
    redeclare_job.py OUT_DIR agree       every rank re-uses "x" with the same new shapes,
                                         several in flight at once, rank 1 joins early,
                                         then both go on after join()
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, mode = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
res = {"rank": r}
first = bps.push_pull(np.full(2, r + 1, np.float32), name="x", average=False)
assert first.tolist() == [3.0, 3.0], first
if mode == "mismatch":
    t0 = time.monotonic()
    try:
        bps.push_pull(np.ones(3 if r == 0 else 4, np.float32), name="x", average=False)
        res["error"] = None
    except bps.BytePSError as exc:
        res["error"] = str(exc)
    res["seconds"] = time.monotonic() - t0
    try:          # later pushes of that layout fail at once too
        bps.push_pull(np.ones(3 if r == 0 else 4, np.float32), name="x", average=False)
        res["again"] = None
    except bps.BytePSError as exc:
        res["again"] = str(exc)
    bps.barrier()      # (a rank that left would fail the other's waiting pushes instead)
else:
    SHAPES = [(3,), (4,), (2, 5), (7,), (1, 1, 1, 1, 1, 1, 1, 1, 1, 3)]   # 5 > 4 lanes
    sums = []

    def step(s):
        hs = [bps.push_pull_async(np.full(shape, (r + 1) * (s + 1), np.float32), name="x",
                                  average=False) for shape in SHAPES]
        sums.append([float(bps.synchronize(h).reshape(-1)[0]) for h in hs])

    for s in range(5 if r == 0 else 3):
        step(s)
    res["last"] = bps.join()
    for s in range(5, 7):
        step(s)
    res["sums"] = sums
bps.shutdown()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)

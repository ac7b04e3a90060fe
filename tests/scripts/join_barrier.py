"""Worker script: barriers while a rank has joined (counted as present) or left (error).

    join_barrier.py OUT_DIR joined|left
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, mode = sys.argv[1], sys.argv[2]
bps.init()
r = bps.rank()
res: dict = {}
if r == 0:
    if mode == "joined":
        res["last"] = bps.join()
    else:
        bps.shutdown()
        res["left_at"] = time.time()
else:
    time.sleep(0.5)
    try:
        bps.barrier()
        res["sum"] = bps.push_pull(np.ones(3, np.float32), name="x", average=False).tolist()
        res["last"] = bps.join()
    except bps.BytePSError as exc:
        res["error"], res["error_at"] = str(exc), time.time()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
if mode == "joined":
    bps.shutdown()

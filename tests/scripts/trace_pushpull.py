"""Worker script for the timeline test: a few 'steps' of two tensors, then telemetry.

argv: out_dir.  Writes out_dir/rank<r>.json with the push-pull speed it saw.
"""
import json
import os
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import api as core

out_dir = sys.argv[1]
bps.init()
r = bps.rank()
w = np.full(300_000, r + 1.0, dtype=np.float32)     # 1.2 MB: several partitions
b = np.full(10, r + 1.0, dtype=np.float32)
comp = json.loads(os.environ.get("TRACE_COMPRESSION", "null"))   # compression_params
for step in range(5):
    hw = bps.push_pull_async(w, name="layer.weight", compression_params=comp)
    hb = bps.push_pull_async(b, name="layer.bias", priority=1)
    bps.synchronize(hb)
    bps.synchronize(hw)
ts, speed = core.get_pushpull_speed()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"ts": ts, "speed": speed, "size": bps.size()}, f)

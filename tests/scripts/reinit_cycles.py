"""Worker script: init()/shutdown() cycles, like the original's meta_test.py around every test.

argv: out_dir cycles.  Each cycle pushes one tensor and checks the sum; writes
out_dir/rank<r>.json with the seconds each init() took.
"""
import json
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, cycles = sys.argv[1], int(sys.argv[2])
inits, failures, rank = [], [], None
for it in range(cycles):
    t = time.monotonic()
    bps.init()
    inits.append(time.monotonic() - t)
    rank, n = bps.rank(), bps.size()
    y = bps.push_pull(np.full(1000, rank + 1.0 + it, np.float32), name=f"cycle{it % 2}",
                      average=False)
    want = n * (n + 1) / 2 + n * it
    if not np.all(y == want):
        failures.append(f"cycle {it}: got {y[:3]}, expected {want}")
    bps.shutdown()
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"inits": inits, "failures": failures}, f)

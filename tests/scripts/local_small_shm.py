"""Local reduction of large tensors on a shm directory too small to hold them.

argv: out_dir [rounds] [mb]. Pushes a ``mb`` MB float32 tensor (and a small one next to
it, both in flight at once) ``rounds`` times; checks sums and averages exactly and writes
out_dir/rank<r>.json.
"""
import json
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import api

out_dir = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 50
bps.init()
r, n = bps.rank(), bps.size()
N = mb * 1000 * 1000 // 4
failures = []
for rnd in range(rounds):
    big = ((np.arange(N, dtype=np.int64) * 7 + r + rnd) % 1000).astype(np.float32)
    small = np.full(1000, r + 1 + rnd, np.int32)
    hb = bps.push_pull_async(big, name="big", average=rnd % 2 == 1)
    hs = bps.push_pull_async(small, name="small", average=False)
    y, s = bps.synchronize(hb), bps.synchronize(hs)
    total = sum(((np.arange(N, dtype=np.int64) * 7 + k + rnd) % 1000) for k in range(n))
    exp = (total / n if rnd % 2 == 1 else total).astype(np.float32)
    if not np.array_equal(y, exp):
        bad = np.flatnonzero(y != exp)
        failures.append(f"round {rnd} big: {bad.size} wrong elements, first at {bad[0]}: "
                        f"got {y[bad[0]]} expected {exp[bad[0]]}")
    if not np.array_equal(s, np.full(1000, sum(k + 1 + rnd for k in range(n)), np.int32)):
        failures.append(f"round {rnd} small: {s[:4]}")
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"failures": failures, "rank": r, "size": n,
               "reducer": api._STATE.local is not None}, f)
bps.shutdown()

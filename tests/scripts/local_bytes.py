"""Worker script: a fixed set of push_pulls whose payload bytes the servers count.

argv: rounds.  Sizes straddle partition edges (BYTEPS_PARTITION_BYTES) and are
divisible by 6 so that every local size of the tests splits them evenly.
"""
import sys

import numpy as np

import byteps.numpy as bps

rounds = int(sys.argv[1])
bps.init()
SIZES = {"a": 6 * 1000, "b": 6 * 7, "c": 6 * 3001}
for rnd in range(rounds):
    for name, n in SIZES.items():
        y = bps.push_pull(np.full(n, bps.rank() + 1, np.float32), name=name, average=False)
        want = bps.size() * (bps.size() + 1) / 2
        if not np.all(y == want):
            raise SystemExit(f"{name}: got {y[:4]}, expected {want}")
bps.shutdown()

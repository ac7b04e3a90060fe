"""Worker script for the local-reduction tests: every dtype, sizes across partition edges.

argv: out_dir [rounds]. Checks sums/averages against the exact expectation and writes
out_dir/rank<r>.json with failures, digests and the job shape seen by this rank.
"""
import hashlib
import json
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import api

out_dir = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
bps.init()
r, n = bps.rank(), bps.size()
cfg = api.get_config()
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8", "int8"]
part = cfg.partition_bytes
failures, digests = [], {}


def data(dt, sz, k, rnd):
    return ((np.arange(sz) * 3 + k + rnd) % 5).astype(dt)


for rnd in range(rounds):
    jobs = []
    for dt in DTYPES:
        item = np.dtype(dt).itemsize
        pe = part // item
        # up to 64 KiB one local rank reduces a tensor; above, every rank a slice
        for sz in sorted({1, 2, 5, pe - 1, pe, pe + 1, 2 * pe + 3, 70000 // item + 5}):
            for avg in (False, True):
                jobs.append((dt, sz, avg))
    handles = []
    for i, (dt, sz, avg) in enumerate(jobs):
        name = f"t.{dt}.{sz}.{avg}"
        handles.append((name, dt, sz, avg,
                        bps.push_pull_async(data(dt, sz, r, rnd), name=name, average=avg,
                                            priority=i % 3)))
    for name, dt, sz, avg, h in handles:
        y = bps.synchronize(h)
        total = sum(data(dt, sz, k, rnd).astype(np.int64) for k in range(n))
        exp = (total // n if avg and np.dtype(dt).kind != "f" else
               total / n if avg else total)
        exp = np.asarray(exp).astype(dt)
        if y.dtype != np.dtype(dt) or y.shape != (sz,) or not np.array_equal(y, exp):
            failures.append(f"round {rnd} {name}: got {y[:6]} expected {exp[:6]}")
        digests[name] = hashlib.sha256(y.tobytes()).hexdigest()
    m = np.full((3, 5), float(r + rnd), dtype=np.float32)
    api.synchronize(api.push_pull_async(m, "inplace", average=False, out=m))
    if not np.array_equal(m, np.full((3, 5), float(sum(range(n)) + n * rnd), np.float32)):
        failures.append(f"round {rnd} inplace: {m.ravel()[:4]}")
    b = bps.broadcast(np.full(4, r + 10, np.int64), root_rank=n - 1, name=f"bc{rnd}")
    if not np.array_equal(b, np.full(4, n - 1 + 10)):
        failures.append(f"round {rnd} broadcast: {b}")
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"failures": failures, "digests": digests, "size": n, "rank": r,
               "local_rank": bps.local_rank(), "local_size": bps.local_size(),
               "reducer": api._STATE.local is not None}, f)
bps.shutdown()

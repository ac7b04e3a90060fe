"""Worker script: the CPU half of the GPU path (shares pre-reduced inside a switch group).

Each rank plays NCCL's part itself: it knows every rank's data, so it returns the
sum over its group for the range the reducer asks for.  argv: out_dir.
"""
import json
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import api
from byteps.core.local import push_pull_prereduced_async

out_dir = sys.argv[1]
bps.init()
red = api._STATE.local
r, n, L, lr = bps.rank(), bps.size(), bps.local_size(), bps.local_rank()
base = r - lr                       # first global rank of this host
failures = []


def data(rank, size, dt):
    return ((np.arange(size) + 3 * rank) % 11).astype(dt)


for dt in ("float32", "int64", "float16"):
    for size in (1, 3, 1000, 1025, 5000, 40000):
        chunk = max(1, api.get_config().partition_bytes // np.dtype(dt).itemsize)
        group = [base + k for k in red.stages.mygroup]
        full = sum(data(g, size, dt).astype(np.int64) for g in group).astype(dt)

        def pre(j, a, b, full=full, chunk=chunk, size=size):
            assert j * chunk <= a <= b <= min(size, (j + 1) * chunk), (j, a, b)
            return full[a:b]
        like = np.empty(size, dt)
        for avg in (False, True):
            h = push_pull_prereduced_async(like, f"g.{dt}.{size}.{avg}", pre, average=avg)
            y = api.synchronize(h)
            tot = sum(data(k, size, dt).astype(np.int64) for k in range(n))
            exp = (tot // n if dt != "float16" and dt != "float32" else tot / n) if avg else tot
            exp = np.asarray(exp).astype(dt)
            if not np.array_equal(y, exp):
                failures.append(f"{dt} {size} avg={avg}: {y[:5]} != {exp[:5]}")
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"failures": failures, "groups": red.groups, "two_level": red.stages.two_level}, f)
bps.shutdown()

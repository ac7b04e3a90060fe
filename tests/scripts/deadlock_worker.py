"""Worker script: rank 0 waits in allreduce "a", rank 1 in broadcast "b" (a deadlock).

argv: out_dir framework (numpy | torch) [barrier: rank 0 waits in barrier() instead].  First rank 0 computes for 3.5 s while rank 1 waits in
allreduce "slow" (a busy rank: no deadlock).  Then both ranks must fail within seconds with an error
naming both ranks and both names (the scheduler's deadlock detection, without
BYTEPS_COLLECTIVE_TIMEOUT_S); after shutdown() and init() 20 more collectives must work.
Writes out_dir/rank<r>.json: seconds to the error, its type and text, the 20 results' check.
"""
import json
import sys
import time

import numpy as np

out_dir, fw = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "collectives"    # barrier: rank 0 in barrier()
if fw == "torch":
    import torch

    import byteps.torch as bps

    def arr(x):
        return torch.full((4,), float(x))

    def val(t):
        return t.numpy()
else:
    import byteps.numpy as bps

    def arr(x):
        return np.full(4, float(x), np.float32)

    def val(t):
        return np.asarray(t)

bps.init()
r, n = bps.rank(), bps.size()
bps.allreduce(arr(1), name="warm-up", op=bps.Sum)     # the job runs
if r == 0:
    time.sleep(3.5)              # busy (not blocked) for 3 heartbeats: no deadlock
slow = float(val(bps.allreduce(arr(1), name="slow", op=bps.Sum))[0])
t0 = time.monotonic()
err = None
try:
    if r == 0 and mode == "barrier":
        bps.barrier()
    elif r == 0:
        bps.allreduce(arr(1), name="a", op=bps.Sum)
    else:
        bps.broadcast(arr(1), root_rank=0, name="b")
except Exception as exc:         # noqa: BLE001 - the type is checked by the test
    err = exc
took = time.monotonic() - t0
bps.shutdown()
bps.init()
bad = []
for i in range(20):
    y = val(bps.allreduce(arr(r + i), name=f"after.{i % 3}", op=bps.Sum))
    want = n * i + n * (n - 1) / 2
    if not np.all(y == want):
        bad.append(f"allreduce {i}: {y} != {want}")
bps.shutdown()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"slow": slow, "took": took, "type": type(err).__name__, "mro": [c.__name__ for c in
               type(err).__mro__], "error": str(err), "bad": bad}, f)

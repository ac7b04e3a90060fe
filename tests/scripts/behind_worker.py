"""Worker script: one rank leaves a phase early (as a test failing on one rank does), the
other waits in that phase's last unnamed call.  argv: out_dir.

Every phase begins with init() (Horovod's suites call it at the start of every test).  In
phase 1 rank 0 makes one unnamed allreduce and moves on to phase 2 (init() again); rank 1
makes two, and its second never completes.  Rank 1 must fail within seconds with
CollectiveBehindError (a CollectiveTimeoutError), without BYTEPS_COLLECTIVE_TIMEOUT_S, and
stay in the job: its init() of phase 2 meets rank 0's, whose wait never fails.  Then 20
unnamed allreduces in 4 more phases must be right on both ranks.  Writes
out_dir/rank<r>.json.
"""
import json
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
bps.allreduce(np.ones(4, np.float32), name="warm-up", op=bps.Sum)
bps.init()                                        # phase 1
first = float(bps.allreduce(np.ones(4, np.float32), op=bps.Sum)[0])
t0, err = time.monotonic(), None
if r == 1:
    try:
        bps.allreduce(np.ones(4, np.float32), op=bps.Sum)     # rank 0 never makes it
    except Exception as exc:                     # noqa: BLE001 - the type is checked
        err = exc
took = time.monotonic() - t0
bad = []
for phase in range(5):
    bps.init()                                    # phases 2..6
    for i in range(4 if phase else 1):
        y = np.asarray(bps.allreduce(np.full(4, r + i, np.float32), op=bps.Sum))
        want = n * i + n * (n - 1) / 2
        if not np.all(y == want):
            bad.append(f"phase {phase + 2} allreduce {i}: {y} != {want}")
bps.shutdown()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump({"first": first, "took": took, "type": type(err).__name__,
               "mro": [c.__name__ for c in type(err).__mro__], "error": str(err),
               "bad": bad}, f)

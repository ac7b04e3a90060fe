"""Worker script: names re-used across join()s (issue 24's decentralized-after-join hang).

    join_reuse.py OUT_DIR LAGGARD DELAY

Four cells, each ending with an exact average (``average_now``: the parameters and the
``#contributors`` count, both under the same prefix in every cell, as every algorithm's
``finish()`` does).  Cells 1 and 3 are uneven: rank r stops r steps early and calls
``join()`` before the average.  The local rank ``LAGGARD`` of every host waits ``DELAY``
seconds before it leaves ``join()`` (in :meth:`JoinState.end`, the local reduction's own
step of the join), so the other local ranks of its host have already started the next
average under the re-used names while it is still inside ``join()``: the window where
a joined rank must not add zeros any more.  Each rank writes the averages it got.
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps.core.algorithms.base import average_now
from byteps.core.local import join as local_join

out_dir, laggard, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
_end = local_join.JoinState.end


def late_end(self, rounds):
    if int(os.environ.get("BYTEPS_LOCAL_RANK", "0")) == laggard:
        time.sleep(delay)
    _end(self, rounds)


local_join.JoinState.end = late_end
bps.init()
r, n = bps.rank(), bps.size()
got = []
for cell in range(4):
    uneven = cell % 2 == 1
    steps = 6 - (r if uneven else 0)
    for s in range(steps):          # some training under names of this cell only
        bps.push_pull(np.full(5, r + s, np.float32), name=f"c{cell}.grad", average=True)
    if uneven:
        bps.join()
    params = {"w": np.full(300, 4.0 * (r + 1) + cell, np.float32),
              "b": np.full(3, float(r), np.float64)}
    average_now(params, "Final.")  # the same names in every cell
    got.append({k: float(v[0]) for k, v in params.items()})
    bps.push_pull(np.ones(2, np.float32), name="Final.after", average=False)
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"size": n, "averages": got}, f)
bps.shutdown()

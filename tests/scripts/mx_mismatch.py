"""MXNet worker script: ranks whose parameter shapes differ get a clear error, not a hang.

argv: what ("trainer" | "broadcast"), out_dir.
"""
import json
import sys
import time

from mxnet import gluon

import byteps.mxnet as bps

what, out_dir = sys.argv[1], sys.argv[2]
bps.init()
r = bps.rank()
net = gluon.nn.Dense(3, in_units=4 + r)          # weight (3, 4) on rank 0, (3, 5) on rank 1
net.initialize()
t0 = time.monotonic()
res = {"rank": r, "error": None}
try:
    if what == "trainer":
        bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    else:
        bps.broadcast_parameters({k: v.data() for k, v in net.collect_params().items()})
except bps.BytePSError as exc:
    res["error"] = str(exc)
res["seconds"] = time.monotonic() - t0
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)

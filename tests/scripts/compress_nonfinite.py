"""A rank's gradient holds NaN or inf in one step, with a compressor that cannot encode
them (tests/test_compression.py): that push_pull must neither hang nor fail on one rank.

    compress_nonfinite.py OUT_DIR COMPRESSOR [diloco|decentralized]

Each rank pushes a tensor of 3 partitions (BYTEPS_PARTITION_BYTES=4000: 1000 floats each)
filled with rank + 1, compressed with COMPRESSOR and error feedback, for 7
steps; at step 3 the highest rank puts a NaN in partition 1 and, with more than 2 ranks,
the rank below it an inf.  Like a loop with loss scaling, every rank skips the
step whose result is not finite.  Writes OUT_DIR/rank<r>.json: every step's result as
[finite?, first element of each partition], and the steps applied.  ``diloco``: DiLoCo
(H = 3) with COMPRESSOR outer gradients instead, the highest rank's gradient NaN at step
4; writes how many parameters are NaN after each step.  ``decentralized``: Decentralized
(shift_one) with COMPRESSOR model differences, the highest rank's model NaN at step 3.
"""
import json
import sys

import numpy as np

import byteps.numpy as bps

OUT, COMPRESSOR = sys.argv[1], sys.argv[2]
PARAMS = {"compressor": COMPRESSOR, "ef": "vanilla"}

bps.init()
r, n = bps.rank(), bps.size()
if sys.argv[3:] in (["diloco"], ["decentralized"]):
    p = {"w": np.full(3000, 0.5, np.float32)}
    alg = bps.algorithms.DiLoCo(inner_steps=3, compression_params=PARAMS) \
        if sys.argv[3] == "diloco" else bps.algorithms.Decentralized(
            peer_selection="shift_one", compression_params={"compressor": COMPRESSOR})
    opt = bps.DistributedOptimizer(lambda ps, gs: ps["w"].__isub__(0.1 * gs["w"]), p,
                                   algorithm=alg)
    nans = []
    for step in range(10):
        g = np.full(3000, 0.01 * (r + 1), np.float32)
        if step == 4 and r == n - 1 and sys.argv[3] == "diloco":
            g[1500] = np.nan
        if step == 3 and r == n - 1 and sys.argv[3] == "decentralized":
            p["w"][1500] = np.nan
        opt.step({"w": g})
        nans.append(int(np.isnan(p["w"]).sum()))
    opt.finish()
    with open(f"{OUT}/rank{r}.json", "w") as f:
        json.dump({"nans": nans}, f)
    bps.shutdown()
    sys.exit(0)
steps, applied = [], 0
for step in range(7):
    g = np.full(3000, r + 1.0, np.float32)
    if step == 3 and r == n - 1:
        g[1500] = np.nan
    if step == 3 and n > 2 and r == n - 2:
        g[1700] = np.inf
    out = bps.push_pull(g, name="grad", average=True, compression_params=PARAMS)
    finite = bool(np.isfinite(out).all())
    applied += finite                     # loss scaling: skip a step with inf/NaN
    steps.append([finite, [float(out[i]) if np.isfinite(out[i]) else str(out[i])
                           for i in (0, 1000, 2000)],
                  int(np.isnan(out).sum())])
with open(f"{OUT}/rank{r}.json", "w") as f:
    json.dump({"steps": steps, "applied": applied}, f)
bps.shutdown()

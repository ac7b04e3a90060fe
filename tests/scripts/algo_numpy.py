"""Worker script for tests/test_algorithms.py: numpy async push_pull, the algorithms
on the digits MLP, bounded staleness.  Writes OUT_DIR/rank<r>.json."""
import json
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps.core import api
from digits_mlp import accuracy, digits, init_params
from digits_mlp import grads as mlp_grads

out_dir, mode = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
res = {}


if mode == "deltas":
    for _ in range(3):
        v = bps.push_pull(np.full(4, r + 1.0, np.float32), name="w", average=False)
    bps.barrier()
    res["value"] = bps.push_pull(np.zeros(4, np.float32), name="w", average=False).tolist()
    try:
        bps.push_pull(np.ones(2, np.float32), name="avg", average=True)
    except bps.BytePSError as exc:
        res["error"] = str(exc)
    # broadcasts and barriers stay synchronous in async mode
    res["bcast"] = bps.broadcast(np.full(3, r + 5.0), root_rank=1, name="b").tolist()
    res["bcast2"] = bps.broadcast(np.full(3, r + 7.0), root_rank=0, name="b").tolist()
elif mode == "train":
    algo = sys.argv[3]
    x, y, xt, yt = digits()
    p = init_params(r)
    lr = 0.2

    def sgd(params, grads):
        for k in params:
            params[k] -= lr * grads[k]
    alg = {"sync": bps.algorithms.SyncPS(), "async": None,
           "average": bps.algorithms.AsyncModelAverage(sync_interval_ms=50)}[algo]
    opt = bps.DistributedOptimizer(sgd, p, algorithm=alg)
    xs, ys = x[r::n], y[r::n]
    slow = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    t0 = time.monotonic()
    steps = 0
    for epoch in range(15):
        for i in range(0, len(xs) - 31, 32):
            opt.step(mlp_grads(p, xs[i:i + 32], ys[i:i + 32]))
            steps += 1
            if slow and r == n - 1:
                time.sleep(slow)
    if algo == "average":
        opt.algorithm.abort()
        opt.algorithm.resume()
    opt.finish()
    res["seconds"] = time.monotonic() - t0
    res["steps"] = steps
    res["acc"] = accuracy(p, xt, yt)
    res["digest"] = float(sum(float(np.abs(v).sum()) for v in p.values()))
    if algo == "average":
        res["rounds"] = opt.algorithm.rounds
elif mode == "stale":
    # bounded staleness: rank n-1 is slow; everyone records the rounds it saw
    steps = int(sys.argv[3])
    vals = []
    for s in range(steps):
        v = bps.push_pull(np.ones(8, np.float32), name="stale", average=False)
        vals.append(float(v[0]))
        if r == n - 1:
            time.sleep(0.05)
    res["vals"] = vals
elif mode == "same":
    # staleness 0 = synchronous: async deltas give the synchronous sums
    acc_a, acc_s = np.zeros(5, np.float32), np.zeros(5, np.float32)
    out_a, out_s = [], []
    for s in range(6):
        d = np.arange(5, dtype=np.float32) * (r + 1) + s
        out_a.append(bps.push_pull(d, name="a", average=False).tolist())
        acc_s += api.push_pull(d, "s", average=False)
        out_s.append(acc_s.tolist())
        if r == 0:
            time.sleep(0.03)
    res["async"], res["sync"] = out_a, out_s
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

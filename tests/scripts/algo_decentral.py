"""Worker script for tests/test_decentralized.py: argv = out_dir mode [args].

Modes: ``ref K`` (each decentralized algorithm for K steps on rank-specific parameters and
gradients; records the parameters for the numpy reference), ``train ALGS`` (the digits
MLP trained by each comma-separated algorithm in turn; accuracy and digests), ``kill``
(shift_one forever on a small model; writes pid.rank<r>, ready.rank<r>, and the error).
Writes OUT_DIR/rank<r>.json.
"""
import json
import os
import sys
import time
import traceback

import numpy as np

import byteps.numpy as bps
from digits_mlp import accuracy, digits, grads, init_params

out_dir, mode = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
res = {}
alg_mod = bps.algorithms


def ref_params(rank):
    rng = np.random.default_rng(100 + rank)
    return {"w": rng.standard_normal((5, 3)).astype(np.float32),
            "b": rng.standard_normal(7).astype(np.float32)}


def ref_grad(rank, step, name, shape):
    rng = np.random.default_rng([rank, step, len(name)])
    return rng.standard_normal(shape).astype(np.float32)


def make(name):
    return {"sync": lambda: alg_mod.SyncPS(), "async": lambda: alg_mod.AsyncPS(),
            "average": lambda: alg_mod.AsyncModelAverage(sync_interval_ms=20),
            "shift_one": lambda: alg_mod.Decentralized(peer_selection="shift_one"),
            "all": lambda: alg_mod.Decentralized(peer_selection="all"),
            "lowp": lambda: alg_mod.LowPrecisionDecentralized()}[name]()


if mode == "ref":
    k = int(sys.argv[3])
    for name in ("shift_one", "all", "lowp"):
        p = ref_params(r)
        alg = make(name)
        alg.init(p)
        for t in range(k):
            for key in p:
                p[key] -= np.float32(0.1) * ref_grad(r, t, key, p[key].shape)
            alg.after_step(p)
        res[name] = {key: v.tolist() for key, v in p.items()}
        alg.finish(p)
        res[name + ".final"] = {key: v.tolist() for key, v in p.items()}
elif mode == "train":
    x, y, xt, yt = digits()
    xs, ys = x[r::n], y[r::n]
    lr = 0.2
    EPOCHS = int(os.environ.get("ALGO_EPOCHS", "25"))
    for name in sys.argv[3].split(","):
        p = init_params(r)

        def sgd(params, g):
            for key in params:
                params[key] -= lr * g[key]
        opt = bps.DistributedOptimizer(sgd, {f"{name}.{k}": v for k, v in p.items()},
                                       algorithm=make(name))
        t0 = time.monotonic()
        for epoch in range(EPOCHS):
            for i in range(0, len(xs) - 31, 32):
                q = {k: opt.params[f"{name}.{k}"] for k in p}
                g = grads(q, xs[i:i + 32], ys[i:i + 32])
                opt.step({f"{name}.{k}": v for k, v in g.items()})
        opt.finish()
        q = {k: opt.params[f"{name}.{k}"] for k in p}
        res[name] = {"acc": accuracy(q, xt, yt), "seconds": time.monotonic() - t0,
                     "digest": float(sum(float(np.abs(v).sum()) for v in q.values()))}
elif mode == "kill":
    with open(os.path.join(out_dir, f"pid.rank{r}"), "w") as f:
        f.write(str(os.getpid()))
    p = {"w": np.ones(1000, np.float32)}
    alg = make("shift_one")
    alg.init(p)
    t = 0
    try:
        while True:
            p["w"] *= np.float32(0.999)
            alg.after_step(p)
            t += 1
            if t == 5:
                open(os.path.join(out_dir, f"ready.rank{r}"), "w").close()
            time.sleep(0.01)
    except bps.BytePSError as exc:
        res["error"] = str(exc)
        res["trace"] = traceback.format_exc()[-2000:]
        with open(f"{out_dir}/rank{r}.json", "w") as f:
            json.dump(res, f)
        raise
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

"""Worker script for tests/test_diloco.py: DiLoCo phases in one job, each under its own
key prefix, results in OUT/rank<r>.json.

    diloco_job.py OUT PHASES     (PHASES: comma-separated of replay, frag, ovl, ovl1, h1,
                                  sync1, digits, onebit, overlap, seconds, join)

* ``replay``/``frag``/``h1``: least squares on each rank's own rows (LS_ROWS below), plain
  SGD as the inner optimizer; the final parameters and the sync log are written for the
  test's one-process numpy replay; ``sync1``: SyncPS on the same rows (what ``h1``, H = 1,
  outer_lr = 1, no momentum, must equal).
* ``digits``: the digits MLP, int8-compressed outer gradients, H = 20; ``onebit``: 60
  steps, onebit + error feedback, H = 10 (the test counts the bytes at the server).
* ``overlap``: Streaming DiLoCo, 2 fragments, overlapped exchanges; ``ovl1``: least
  squares with ``overlap=1`` (each exchange merged at most one step after its push).
* ``seconds``: ``inner_seconds``, 2 fragments, rank 1 ten times slower; ``secjoin``:
  ``inner_seconds`` and rank 1 joins half-way.
* ``join``: uneven steps (rank 1 takes fewer), ``bps.join()``, then ``finish()``.
"""
import json
import sys

import numpy as np
from digits_mlp import accuracy, digits, init_params
from digits_mlp import grads as mlp_grads

import byteps.numpy as bps

out, phases = sys.argv[1], sys.argv[2].split(",")
bps.init()
r, n = bps.rank(), bps.size()
res = {"size": n}
LR = np.float32(0.05)


def ls_data(rank: int):
    rng = np.random.default_rng(100 + rank)
    X = rng.standard_normal((32, 6)).astype(np.float32)
    y = (X @ np.arange(1, 7, dtype=np.float32) + rank).astype(np.float32)
    return X, y


def ls_grad(p, rank):
    X, y = ls_data(rank)
    return {"w": (X.T @ (X @ p["w"] - y) / np.float32(32)).astype(np.float32),
            "b": np.array([np.mean(X @ p["w"] - y)], np.float32)}


def sgd(params, grads):
    for k in params:
        params[k] -= LR * grads[k]


def sgd_mlp(params, grads):
    for k in params:
        params[k] -= np.float32(0.2) * grads[k]


def ls_params():
    return {"w": np.full(6, 0.5, np.float32) * (1 + r), "b": np.zeros(1, np.float32)}


def run_ls(tag, steps, **kw):
    p = ls_params()
    alg = bps.algorithms.DiLoCo(prefix=f"{tag}.", **kw)
    opt = bps.DistributedOptimizer(sgd, p, algorithm=alg)
    for _ in range(steps):
        opt.step(ls_grad(p, r))
    opt.finish()
    res[tag] = {"p": {k: v.tolist() for k, v in p.items()}, "log": alg.log,
                "rounds": alg.rounds}


for phase in phases:
    if phase == "replay":
        run_ls("replay", 10, inner_steps=3, outer_lr=0.7, outer_momentum=0.9)
    elif phase == "frag":
        run_ls("frag", 9, inner_steps=4, outer_lr=0.5, outer_momentum=0.8, nesterov=False,
               fragments=2)
    elif phase == "ovl":
        run_ls("ovl", 13, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, fragments=2,
               overlap=True)
    elif phase == "ovl1":           # overlap=1: every merge at most 1 step after its push
        run_ls("ovl1", 13, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, fragments=2,
               overlap=1)
    elif phase == "h1":
        run_ls("h1", 6, inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
    elif phase == "sync1":          # SyncPS on the same rows: what h1 must equal
        p = ls_params()
        opt = bps.DistributedOptimizer(sgd, p, algorithm=bps.algorithms.SyncPS("sync1."))
        for _ in range(6):
            opt.step(ls_grad(p, r))
        opt.finish()
        res["sync1"] = {"p": {k: v.tolist() for k, v in p.items()}}
    elif phase == "onebit":         # onebit + error feedback outer gradients, counted
        x, y, xt, yt = digits()
        p = init_params(r)
        alg = bps.algorithms.DiLoCo(inner_steps=10, prefix="onebit.", compression_params={
            "compressor": "onebit", "ef": "vanilla"})
        opt = bps.DistributedOptimizer(sgd_mlp, p, algorithm=alg)
        xs, ys = x[r::n], y[r::n]
        for i in range(0, 32 * 60, 32):
            j = i % (len(xs) - 31)
            opt.step(mlp_grads(p, xs[j:j + 32], ys[j:j + 32]))
        opt.finish()
        res["onebit"] = {"acc": accuracy(p, xt, yt), "rounds": alg.rounds}
    elif phase in ("digits", "overlap"):
        x, y, xt, yt = digits()
        p = init_params(r)
        kw = ({"compression_params": {"compressor": "int8", "ef": "vanilla"}}
              if phase == "digits" else {"fragments": 2, "overlap": True})
        alg = bps.algorithms.DiLoCo(inner_steps=20, outer_lr=0.7, outer_momentum=0.9,
                                    prefix=f"{phase}.", **kw)
        opt = bps.DistributedOptimizer(sgd_mlp, p, algorithm=alg)
        xs, ys = x[r::n], y[r::n]
        for epoch in range(8):
            for i in range(0, len(xs) - 31, 32):
                opt.step(mlp_grads(p, xs[i:i + 32], ys[i:i + 32]))
        opt.finish()
        res[phase] = {"acc": accuracy(p, xt, yt), "rounds": alg.rounds, "log": alg.log,
                      "digest": float(sum(np.abs(v).sum() for v in p.values()))}
    elif phase == "seconds":
        import time
        p = ls_params()
        alg = bps.algorithms.DiLoCo(inner_seconds=0.15, fragments=2, prefix="seconds.")
        opt = bps.DistributedOptimizer(sgd, p, algorithm=alg)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            opt.step(ls_grad(p, r))
            time.sleep(0.002 if r == 0 else 0.02)     # rank 1 takes ~10x fewer steps
        opt.finish()
        res["seconds"] = {"p": {k: v.tolist() for k, v in p.items()}, "log": alg.log,
                          "rounds": alg.rounds}
    elif phase == "secjoin":        # inner_seconds, then rank 1 joins half-way
        import time
        p = ls_params()
        alg = bps.algorithms.DiLoCo(inner_seconds=0.1, fragments=2, prefix="secjoin.")
        opt = bps.DistributedOptimizer(sgd, p, algorithm=alg)
        t0 = time.monotonic()
        while time.monotonic() - t0 < (0.4 if r == 1 else 0.8):
            opt.step(ls_grad(p, r))
            time.sleep(0.005)
        last = bps.join()
        opt.finish()
        res["secjoin"] = {"p": {k: v.tolist() for k, v in p.items()}, "last": last,
                          "rounds": alg.rounds}
    elif phase == "join":
        p = ls_params()
        alg = bps.algorithms.DiLoCo(inner_steps=3, prefix="join.")
        opt = bps.DistributedOptimizer(sgd, p, algorithm=alg)
        for _ in range(11 if r == 0 else 5):
            opt.step(ls_grad(p, r))
        last = bps.join()
        opt.finish()
        res["join"] = {"p": {k: v.tolist() for k, v in p.items()}, "last": last,
                       "log": alg.log}

with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(res, f)

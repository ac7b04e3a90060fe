"""One worker of benchmarks/algorithms.py: the digits MLP (numpy) trained by one algorithm.

    python -m byteps.launcher python benchmarks/algorithms_worker.py --algo sync|async|
        async_unbounded|shift_one|all|lowp|average [--epochs 30] [--hidden 256]
        [--straggler-rank 3]

Rank 0 evaluates its own model on the test set every ``--eval-every`` steps (that time
is excluded from its samples/s).  The straggler (``--straggler-rank``) sleeps, in every
step, as long as its median step took in the first ``--calib`` steps: it runs 2x slower.
Prints ``CLUSTER_RESULT {json}``: this worker's steps, training seconds, samples/s and
(rank 0) the accuracy curve [[seconds, accuracy], ...].
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import byteps.numpy as bps


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return x[:1500], d.target[:1500], x[1500:], d.target[1500:]


def init(hidden: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, hidden)) * 0.1).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32),
            "b2": np.zeros(hidden, np.float32),
            "w3": (rng.standard_normal((hidden, 10)) * 0.1).astype(np.float32),
            "b3": np.zeros(10, np.float32)}


def forward(p, x):
    h1 = np.maximum(x @ p["w1"] + p["b1"], 0)
    h2 = np.maximum(h1 @ p["w2"] + p["b2"], 0)
    return h1, h2, h2 @ p["w3"] + p["b3"]


def grads(p, x, y):
    h1, h2, z = forward(p, x)
    z = z - z.max(1, keepdims=True)
    pr = np.exp(z)
    pr /= pr.sum(1, keepdims=True)
    pr[np.arange(len(y)), y] -= 1
    pr /= len(y)
    g = {"w3": h2.T @ pr, "b3": pr.sum(0)}
    d2 = (pr @ p["w3"].T) * (h2 > 0)
    g["w2"], g["b2"] = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ p["w2"].T) * (h1 > 0)
    g["w1"], g["b1"] = x.T @ d1, d1.sum(0)
    return {k: v.astype(np.float32) for k, v in g.items()}


def accuracy(p, x, y) -> float:
    return float((forward(p, x)[2].argmax(1) == y).mean())


def algorithm(name: str, interval_ms: float):
    a = bps.algorithms
    return {"sync": a.SyncPS, "async": a.AsyncPS, "async_unbounded": a.AsyncPS,
            "shift_one": lambda: a.Decentralized(peer_selection="shift_one"),
            "all": lambda: a.Decentralized(peer_selection="all"),
            "lowp": a.LowPrecisionDecentralized,
            "average": lambda: a.AsyncModelAverage(sync_interval_ms=interval_ms)}[name]()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", required=True)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--straggler-rank", type=int, default=-1)
    ap.add_argument("--calib", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    a = ap.parse_args()
    bps.init()
    r, n = bps.rank(), bps.size()
    x, y, xt, yt = digits()
    xs, ys = x[r::n], y[r::n]
    p = init(a.hidden, 1)
    lr = a.lr

    def sgd(params, g):
        for k in params:
            params[k] -= lr * g[k]
    opt = bps.DistributedOptimizer(sgd, p, algorithm=algorithm(a.algo, a.interval_ms))
    steps_per_epoch = len(xs) // a.batch
    durations, curve = [], []
    sleep = 0.0
    evals = 0.0
    bps.barrier()
    t0 = time.monotonic()
    step = 0
    for _ in range(a.epochs):
        for i in range(steps_per_epoch):
            s0 = time.monotonic()
            sl = slice(i * a.batch, (i + 1) * a.batch)
            opt.step(grads(p, xs[sl], ys[sl]))
            if r == a.straggler_rank:
                if step < a.calib:
                    durations.append(time.monotonic() - s0)
                else:
                    sleep = sleep or statistics.median(durations)
                    time.sleep(sleep)
            step += 1
            if r == 0 and step % a.eval_every == 0:
                e0 = time.monotonic()
                curve.append([e0 - t0 - evals, accuracy(p, xt, yt)])
                evals += time.monotonic() - e0
    train_s = time.monotonic() - t0 - evals
    opt.finish()
    res = {"algo": a.algo, "rank": r, "steps": step, "seconds": train_s,
           "samples_per_s": step * a.batch / train_s, "straggler_sleep_s": sleep,
           "final_acc": accuracy(p, xt, yt)}
    if r == 0:
        res["curve"] = curve
    print("CLUSTER_RESULT " + json.dumps(res), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()

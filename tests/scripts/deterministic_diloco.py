"""Worker script for tests/test_deterministic_outer.py: argv = out_dir steps jitter_seed.

DiLoCo (H = 2, Nesterov) with plain SGD as the inner optimizer on per-rank gradients of
very different magnitudes (so that the servers' sum of outer gradients depends on its
order), parameters over several partitions and both servers.  Before each step that ends
a round every rank sleeps a time drawn from (jitter_seed, rank, step): two seeds give the
servers different arrival orders of the outer pushes.  Rank 0 writes out_dir/params.npz;
every rank writes out_dir/rank<r>.json (steps, digest of its parameters).
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SHAPES = {"w0": (60_000,), "w1": (300, 41), "b": (17,)}
H = 2

bps.init()
r = bps.rank()
params = {k: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s)
          for k, s in SHAPES.items()}


def grads(step: int) -> dict:
    out = {}
    for name, shape in SHAPES.items():
        rng = np.random.default_rng([r, step, len(name)])
        g = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
        out[name] = g.astype(np.float32)
    return out


def sgd(p, g):
    for k in p:
        p[k] -= np.float32(0.01) * g[k]


alg = bps.algorithms.DiLoCo(inner_steps=H, outer_lr=0.7, outer_momentum=0.9, prefix="det.")
opt = bps.DistributedOptimizer(sgd, params, algorithm=alg)
for step in range(steps):
    if step % H == H - 1:       # this step ends a round: its outer push goes out now
        time.sleep(float(np.random.default_rng([seed, r, step]).uniform(0, 0.02)))
    opt.step(grads(step))
opt.finish()
digest = hashlib.sha256(b"".join(params[k].tobytes() for k in SHAPES)).hexdigest()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"rank": r, "steps": steps, "digest": digest, "rounds": alg.rounds}, f)
if r == 0:
    np.savez(os.path.join(out_dir, "params.npz"), **params)
bps.shutdown()

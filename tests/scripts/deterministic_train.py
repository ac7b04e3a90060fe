"""Worker script for tests/test_deterministic_sum.py: argv = out_dir steps jitter_seed.

SGD on per-rank gradients of very different magnitudes (so that a sum's bits depend on
its order), synchronous push_pull averaged: float32 tensors over several partitions and
both servers, one float16 tensor and one fp16-compressed tensor.  Before each tensor's
push every rank sleeps a time drawn from (jitter_seed, rank, step, tensor): two seeds
give the servers different arrival orders.  Rank 0 writes out_dir/params.npz; every rank
writes out_dir/rank<r>.json (steps, digest of its parameters).
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SHAPES = {"w0": (150_000,), "w1": (300, 41), "b": (17,), "h16": (5_000,), "c16": (20_000,)}
DTYPE = {"h16": np.float16}
COMP = {"c16": {"compressor": "fp16"}}

bps.init()
r = bps.rank()
params = {k: np.linspace(-1, 1, int(np.prod(s)), dtype=DTYPE.get(k, np.float32)).reshape(s)
          for k, s in SHAPES.items()}


def grad(name: str, step: int) -> np.ndarray:
    rng = np.random.default_rng([r, step, len(name)])
    g = rng.standard_normal(SHAPES[name]) * 10.0 ** rng.integers(-3, 4, SHAPES[name])
    return g.astype(DTYPE.get(name, np.float32))


for step in range(steps):
    jitter = np.random.default_rng([seed, r, step])
    handles = {}
    for k in SHAPES:
        time.sleep(float(jitter.uniform(0, 0.004)))
        handles[k] = bps.push_pull_async(grad(k, step), name=k, compression_params=COMP.get(k))
    for k, h in handles.items():
        params[k] -= params[k].dtype.type(0.01) * bps.synchronize(h)
digest = hashlib.sha256(b"".join(params[k].tobytes() for k in SHAPES)).hexdigest()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"rank": r, "steps": steps, "digest": digest}, f)
if r == 0:
    np.savez(os.path.join(out_dir, "params.npz"), **params)
bps.shutdown()

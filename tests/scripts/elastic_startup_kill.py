"""Elastic worker: the worker of host ``VICTIM`` SIGKILLs itself before it registers.

    elastic_startup_kill.py OUT VICTIM STEPS

The others train STEPS steps of the full-batch least squares of elastic_numpy.py (the
result does not depend on the number of workers) and write OUT/rank<r>.json.
"""
import json
import os
import signal
import sys

import numpy as np

out, victim, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.environ.get("BYTEPS_EMULATED_HOST") == victim:
    os.kill(os.getpid(), signal.SIGKILL)         # dies before init(): never registered

import byteps.numpy as bps  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((96, 40)).astype(np.float32)
y = X @ rng.standard_normal(40).astype(np.float32)
bps.init()
w = np.zeros(40, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)


@bps.elastic.run
def train(state):
    while state.step < steps:
        rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
        g = X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)
        g = bps.push_pull(g.astype(np.float32), name="grad.w", average=False)
        w[:] -= np.float32(0.05) * g
        state.step += 1
        state.commit()


train(state)
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump({"size": bps.size(), "w": w.tolist()}, f)
bps.shutdown()

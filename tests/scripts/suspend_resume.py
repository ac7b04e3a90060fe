"""The original BytePS's elastic calls in the middle of training, as its
``example/pytorch/elastic_benchmark_byteps.py`` makes them: train, ``bps.suspend()``, log
with ``bps.rank()``/``bps.local_rank()``/``bps.size()``, ``bps.resume(n, s, rank)``,
train on.  Each phase is SGD on a linear model whose gradient every rank knows, so the
script checks the trained weights against the one-process replay, and prints them.

    bpslaunch -np 2 python suspend_resume.py {torch|tensorflow|mxnet|numpy}
"""
import json
import os
import sys
import warnings

import numpy as np

FRAMEWORK = sys.argv[1]
STEPS, LR = 6, 0.1
if FRAMEWORK == "torch":
    import torch

    import byteps.torch as bps
elif FRAMEWORK == "tensorflow":
    import tensorflow as tf

    import byteps.tensorflow as bps
elif FRAMEWORK == "mxnet":
    import mxnet as mx

    import byteps.mxnet as bps
else:
    import byteps.numpy as bps


def grad(w: np.ndarray, rank: int, step: int) -> np.ndarray:
    """Rank ``rank``'s gradient at ``step``: different on every rank, known to all."""
    return (w - (rank + 1.0)) * 0.5 + 0.01 * step


def push_pull(g: np.ndarray, name: str) -> np.ndarray:
    if FRAMEWORK == "torch":
        return bps.push_pull(torch.from_numpy(g), name=name, average=True).numpy()
    if FRAMEWORK == "tensorflow":
        return bps.push_pull(tf.constant(g), name=name, average=True).numpy()
    if FRAMEWORK == "mxnet":
        return bps.allreduce(mx.nd.array(g), average=True, name=name).asnumpy()
    return bps.push_pull(g, name=name, average=True)


def train(w: np.ndarray, first: int) -> np.ndarray:
    for step in range(first, first + STEPS):
        w = w - LR * push_pull(grad(w, bps.rank(), step).astype(np.float32), "w.grad")
    return w


def replay(size: int) -> np.ndarray:
    w = np.zeros(5, np.float32)
    for step in range(2 * STEPS):
        mean = np.mean([grad(w, r, step).astype(np.float32) for r in range(size)], axis=0)
        w = w - LR * mean
    return w


bps.init()
rank, local_rank, size = bps.rank(), bps.local_rank(), bps.size()
w = train(np.zeros(5, np.float32), 0)
bps.suspend()
assert not bps.is_initialized()
assert (bps.rank(), bps.local_rank(), bps.size()) == (rank, local_rank, size), \
    "rank(), local_rank() and size() answer as before between suspend() and resume()"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")            # resume(global_rank=...) is ignored
    bps.resume(size, int(os.environ["DMLC_NUM_SERVER"]), 0)
assert bps.is_initialized() and bps.size() == size
w = train(w, STEPS)
np.testing.assert_allclose(w, replay(size), rtol=1e-5, atol=1e-6)
print("RESULT", json.dumps({"rank": bps.rank(), "w": [float(x) for x in w]}), flush=True)
bps.shutdown()
try:
    bps.rank()
except (ValueError, bps.BytePSError):
    print("shutdown: rank() refused", flush=True)

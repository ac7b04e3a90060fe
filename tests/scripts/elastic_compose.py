"""Elastic worker composed with another feature (tests/test_compose_elastic.py).

    elastic_compose.py OUT STEPS WORKER_KILL SERVER_KILL MODE

Full-batch least squares on one global 96-row batch split over the ranks, so the result
does not depend on the number of workers and must equal a single-process run of STEPS
steps.  MODE:

* ``sync``: the gradient is summed through the servers (push_pull), as elastic_numpy.py;
* ``decentralized`` / ``shift_one``: ``bps.DistributedOptimizer`` with
  ``Decentralized(peer_selection="all" / "shift_one")``: each rank takes a local step on
  ``size x`` its share of the gradient and the models are averaged with the peers (with
  "all" the mean of the local steps is the full-batch step); ``finish()`` at the end;
* ``average``: ``AsyncModelAverage(sync_interval_ms=5)`` with onebit + error feedback,
  each rank stepping on ``size x`` its share (10 ms of work per step), averaged in the
  background; ``finish()`` at the end.

At WORKER_KILL the last rank SIGKILLs itself (once; a step's exchange in flight).  At
SERVER_KILL (>= 0) rank 0 SIGKILLs the last server bpslaunch started (once; a round in
flight), to be survived with BYTEPS_SERVER_REPLICAS=1.  Each process writes
OUT/rank<final rank>.json.
"""
import json
import os
import signal
import sys
import time

import numpy as np

out, steps, kill_step, server_kill = sys.argv[1], *map(int, sys.argv[2:5])
mode = sys.argv[5]

import byteps.numpy as bps  # noqa: E402
from elastic_files import kill_a_server, mark  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((96, 40)).astype(np.float32)
y = X @ rng.standard_normal(40).astype(np.float32)
LR = np.float32(0.05)


bps.init()
w = np.zeros(40, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)
log, doc = [], {}


def on_reset():
    log.append([state.step, bps.rank(), bps.size()])


state.register_reset_callbacks([on_reset])
opt = None
if mode != "sync":
    def sgd(params, grads):
        params["w"] -= LR * grads["w"]
    if mode == "average":
        opt = bps.DistributedOptimizer(
            sgd, {"w": w}, algorithm=bps.algorithms.AsyncModelAverage(sync_interval_ms=5),
            compression_params={"compressor": "onebit", "ef": "vanilla"})
    else:
        sel = "all" if mode == "decentralized" else "shift_one"
        opt = bps.DistributedOptimizer(
            sgd, {"w": w}, algorithm=bps.algorithms.Decentralized(peer_selection=sel))


def grad() -> np.ndarray:
    rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
    return (X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)).astype(np.float32)


def maybe_kill_worker():
    if state.step == kill_step and bps.rank() == bps.size() - 1 and mark(out, "killed"):
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)


@bps.elastic.run
def train(state):
    while state.step < steps:
        if mode == "sync":
            h = bps.push_pull_async(grad(), name="grad.w", average=False)
            maybe_kill_worker()
            if state.step == server_kill and bps.rank() == 0 and mark(out, "server_killed"):
                time.sleep(0.02)
                doc["server_killed"] = kill_a_server()
            w[:] -= LR * bps.synchronize(h)
        else:
            maybe_kill_worker()
            opt.step({"w": grad() * np.float32(bps.size())})
            if mode == "average":
                time.sleep(0.01)
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


train(state)
if opt is not None:
    opt.finish()
doc.update({"w": w.tolist(), "rank": bps.rank(), "size": bps.size(), "resets": log,
            "loss": float(np.mean((X @ w - y) ** 2)), "loss0": float(np.mean(y ** 2))})
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump(doc, f)
bps.shutdown()

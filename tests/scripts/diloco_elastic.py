"""DiLoCo under elastic membership (tests/test_diloco.py).

    diloco_elastic.py OUT STEPS WORKER_KILL SERVER_KILL

Least squares on each rank's rows, DiLoCo(inner_steps=4) through bps.elastic.run.  At
WORKER_KILL the last rank SIGKILLs itself (once): the group re-forms and every rank starts
again from the servers' global parameters (a seed round).  At SERVER_KILL (>= 0) rank 0
SIGKILLs the last server (once), survived with BYTEPS_SERVER_REPLICAS=1: the backup holds
the global parameters and the outer momentum.  Writes OUT/rank<final rank>.json.
"""
import json
import os
import sys
import time

import numpy as np

out, steps, kill_step, server_kill = sys.argv[1], *map(int, sys.argv[2:5])

from elastic_files import kill_a_server, mark

import byteps.numpy as bps

rng = np.random.default_rng(0)
X = rng.standard_normal((96, 12)).astype(np.float32)
y = X @ rng.standard_normal(12).astype(np.float32)
LR = np.float32(0.05)


bps.init()
w = np.zeros(12, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)


def sgd(params, grads):
    params["w"] -= LR * grads["w"]


alg = bps.algorithms.DiLoCo(inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
opt = bps.DistributedOptimizer(sgd, {"w": w}, algorithm=alg)
doc = {}


def grad():
    rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
    return {"w": (X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(len(rows))).astype(np.float32)}


@bps.elastic.run
def train(state):
    while state.step < steps:
        if state.step == kill_step and bps.rank() == bps.size() - 1 and mark(out, "killed"):
            time.sleep(0.05)
            os.kill(os.getpid(), 9)
        if state.step == server_kill and bps.rank() == 0 and mark(out, "server_killed"):
            doc["server_killed"] = kill_a_server()
        opt.step(grad())
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


train(state)
opt.finish()
loss = float(np.mean((X @ w - y) ** 2))
doc.update({"w": w.tolist(), "rank": bps.rank(), "size": bps.size(), "loss": loss,
            "loss0": float(np.mean(y ** 2)), "restarts": sum(e[0] == "sync" and e[2] == 4
                                                            for e in alg.log)})
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump(doc, f)
bps.shutdown()

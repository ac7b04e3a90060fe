"""Elastic worker (numpy): full-batch least squares, one global batch split over the ranks.

    elastic_numpy.py OUT STEPS KILL_STEP ADD_STEP

Every step sums each rank's share of the gradient of the same 96-row global batch, so the
result does not depend on the number of workers: the final ``w`` must equal a
single-process run of STEPS steps (test_elastic.py).  With KILL_STEP > 0 the last rank
SIGKILLs itself in the middle of that step (its push_pull in flight) after lowering the
discovery file to 3 slots; at ADD_STEP rank 0 raises it to 4 again and waits until the
new worker is about to register.  Each process writes OUT/rank<final rank>.json.
"""
import json
import os
import signal
import sys
import time

import numpy as np

out, steps, kill_step, add_step = sys.argv[1], *map(int, sys.argv[2:5])

import byteps.numpy as bps  # noqa: E402
from elastic_files import hosts, mark  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((96, 40)).astype(np.float32)
y = X @ rng.standard_normal(40).astype(np.float32)
LR = np.float32(0.05)


open(os.path.join(out, f"started.{os.getpid()}"), "w").close()   # imports done
t_init = time.time()
bps.init()
t_init = time.time() - t_init
w = np.zeros(40, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)
log = []
reset_at = []
commit_s = []


def on_reset():
    log.append([state.step, bps.rank(), bps.size()])
    reset_at.append(time.time())


state.register_reset_callbacks([on_reset])


@bps.elastic.run
def train(state):
    while state.step < steps:
        rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
        g = X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)
        h = bps.push_pull_async(g.astype(np.float32), name="grad.w", average=False)
        if state.step == kill_step and bps.rank() == bps.size() - 1 and mark(out, "killed"):
            hosts(out, 3)
            with open(os.path.join(out, "killed"), "w") as f:
                f.write(repr(time.time()))
            time.sleep(0.05)                # the push is out: a round of this epoch in flight
            os.kill(os.getpid(), signal.SIGKILL)
        w[:] -= LR * bps.synchronize(h)
        if state.step == add_step and bps.rank() == 0 and mark(out, "added"):
            seen = len([f for f in os.listdir(out) if f.startswith("started.")])
            hosts(out, 4)
            deadline = time.monotonic() + 60
            while len([f for f in os.listdir(out) if f.startswith("started.")]) == seen:
                if time.monotonic() > deadline:
                    raise SystemExit("no new worker started within 60 s")
                time.sleep(0.05)
            time.sleep(0.5)                 # it registers: the scheduler announces it
        state.step += 1
        if state.step % 5 == 0:
            t = time.perf_counter()
            state.commit()
            commit_s.append(time.perf_counter() - t)


t0 = time.monotonic()
train(state)
doc = {"w": w.tolist(), "rank": bps.rank(), "size": bps.size(), "resets": log,
       "pid": os.getpid(), "seconds": time.monotonic() - t0, "reset_at": reset_at,
       "init_s": t_init, "commit_s": commit_s}
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump(doc, f)
bps.shutdown()

"""Elastic worker (numpy): checked collectives whose names are first used after the group
shrank, then called again with a newcomer (test_elastic.py).

    elastic_late_collectives.py OUT STEPS KILL_STEP ADD_STEP

The training is elastic_numpy.py's least squares.  After KILL_STEP (the last rank
SIGKILLs itself in that step; the survivors go on with 3 ranks) every step also runs a
broadcast, an allgather and a broadcast_object under fixed names: the survivors first
use them with 3 ranks, and after ADD_STEP (a new worker joins at the next commit) with 4,
the newcomer for the first time.  Every result is checked here (a wrong value or an
error fails the job).  Each process writes OUT/rank<final rank>.json.
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
bps.init()
w = np.zeros(40, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)
log, late = [], []
state.register_reset_callbacks([lambda: log.append([state.step, bps.rank(), bps.size()])])


def collectives(step: int) -> None:
    """The late-named collectives of one step, checked against what every rank sent."""
    n, r = bps.size(), bps.rank()
    got = bps.broadcast(np.full(5, 100 * step + r, np.int64), root_rank=0, name="late.bcast")
    assert got.tolist() == [100 * step] * 5, (step, r, got)
    rows = bps.allgather(np.full((r + 1, 2), r, np.float32), name="late.gather")
    assert rows[:, 0].tolist() == [k for k in range(n) for _ in range(k + 1)], (step, r, rows)
    # the root's object differs in length from the receivers' (they learn its length)
    obj = bps.broadcast_object({"step": step, "pad": "x" * (r + 7 * step)} if r == 0 else None,
                               root_rank=0, name="late.object")
    assert obj == {"step": step, "pad": "x" * (7 * step)}, (step, r, obj)
    late.append([step, n])


@bps.elastic.run
def train(state):
    while state.step < steps:
        rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
        g = X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)
        h = bps.push_pull_async(g.astype(np.float32), name="grad.w", average=False)
        if state.step == kill_step and bps.rank() == bps.size() - 1 and mark(out, "killed"):
            hosts(out, 3)
            time.sleep(0.05)                # the push is out: a round of this epoch in flight
            os.kill(os.getpid(), signal.SIGKILL)
        w[:] -= LR * bps.synchronize(h)
        if state.step > kill_step:
            collectives(state.step)
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
            state.commit()


train(state)
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump({"w": w.tolist(), "rank": bps.rank(), "size": bps.size(), "resets": log,
               "late": late}, f)
bps.shutdown()

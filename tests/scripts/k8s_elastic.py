"""Elastic worker pod of tests/test_k8s_elastic.py (numpy; run by ``bpslaunch`` in role
mode, as the worker Job's container does).

    k8s_elastic.py OUT STEPS

Full-batch least squares on one 96-row batch split over the ranks (the result does not
depend on the number of workers: it must equal one process's run of STEPS steps).  Every
step also sums ``[1, rank + 1]`` over the ranks and checks it against the membership the
worker believes in (``[size, size (size + 1) / 2]``); each (step, rank, size) is logged.

The test plays the Kubernetes Job controller; three gates make the membership changes
happen at fixed steps, whatever the timing:

* step 20 with 2 workers: rank 0 creates OUT/grow (the test raises ``parallelism`` to 3
  and starts a pod); the members commit until the new worker is let in (size 3);
* step 40 with 3 workers: rank 0 writes its pod's pid (bpslaunch's) to OUT/delete and the
  test deletes that pod (SIGTERM, then SIGKILL); the members exchange until the loss
  reaches them, restore the commit of step 40 and go on as 2 (dense ranks 0 and 1);
* step 45 with 2 workers: the Job controller's replacement pod is let in (size 3), unless
  it registered early enough to join in the re-formation that removed the deleted pod.

Each worker that finishes writes OUT/rank<final rank>.json.
"""
import json
import os
import sys
import time

import numpy as np

out, steps = sys.argv[1], int(sys.argv[2])

from elastic_files import mark

import byteps.numpy as bps

rng = np.random.default_rng(0)
X = rng.standard_normal((96, 40)).astype(np.float32)
y = X @ rng.standard_normal(40).astype(np.float32)
LR = np.float32(0.05)
WAIT_ROUNDS = 900                       # 0.1 s each: a gate gives up after 90 s

open(os.path.join(out, f"started.{os.getpid()}"), "w").close()
bps.init()
w = np.zeros(40, np.float32)
state = bps.elastic.NumpyState({"w": w}, step=0)
resets, checked = [], []
state.register_reset_callbacks([lambda: resets.append([state.step, bps.rank(), bps.size()])])


def wait_until_size(n: int, what: str) -> None:
    """Commit (same count on every member) until the group has n workers."""
    for _ in range(WAIT_ROUNDS):
        if bps.size() == n:
            return
        time.sleep(0.1)
        state.commit()          # a newcomer is let in here: HostsUpdatedInterrupt
    raise SystemExit(f"rank {bps.rank()}: {what} did not happen within 90 s")


def wait_for_loss() -> None:
    """Exchange until a lost member fails the round (WorkersChanged: elastic.run resets)."""
    for _ in range(WAIT_ROUNDS):
        time.sleep(0.1)
        bps.push_pull(np.ones(1, np.float32), name="alive", average=False)
    raise SystemExit(f"rank {bps.rank()}: the deleted pod was not noticed within 90 s")


def first_time(name: str) -> bool:
    """Rank 0's word (one round, so every member agrees): OUT/name does not exist yet.
    (The replacement pod may join in the very re-formation that removes the deleted one:
    back at step 40 with 3 workers, the deletion must not be asked for again.)"""
    mine = float(bps.rank() == 0 and not os.path.exists(os.path.join(out, name)))
    return bps.push_pull(np.array([mine], np.float32), name=f"gate.{name}",
                         average=False)[0] > 0


@bps.elastic.run
def train(state):
    while state.step < steps:
        size = bps.size()
        if state.step == 20 and size == 2:
            if bps.rank() == 0:
                mark(out, "grow")
            wait_until_size(3, "the scale-up to 3 pods")
        if state.step == 40 and size == 3 and first_time("delete"):
            if bps.rank() == 0:             # "delete my pod": its bpslaunch's pid
                with open(os.path.join(out, "delete.tmp"), "w") as f:
                    f.write(str(os.getppid()))
                os.replace(os.path.join(out, "delete.tmp"), os.path.join(out, "delete"))
            wait_for_loss()
        if state.step == 45 and size == 2:
            wait_until_size(3, "the replacement pod's join")
        rows = np.array_split(np.arange(96), size)[bps.rank()]
        g = X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)
        h = bps.push_pull_async(g.astype(np.float32), name="grad.w", average=False)
        who = bps.push_pull(np.array([1, bps.rank() + 1], np.float32), name="members",
                            average=False)
        want = [size, size * (size + 1) // 2]
        if who.tolist() != want:
            raise SystemExit(f"step {state.step} rank {bps.rank()}: members sum "
                             f"{who.tolist()}, the membership of {size} implies {want}")
        w[:] -= LR * bps.synchronize(h)
        checked.append([state.step, bps.rank(), size])
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


train(state)
doc = {"w": w.tolist(), "rank": bps.rank(), "size": bps.size(), "resets": resets,
       "checked": checked, "pid": os.getpid(), "ppid": os.getppid()}
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump(doc, f)
bps.shutdown()

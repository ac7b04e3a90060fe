"""Worker script for the server-failover tests: argv = out_dir steps kill_step.

Trains float32 "layers" by SGD on deterministic per-rank gradients (synchronous
push_pull, averaged; one tensor fp16-compressed).  With BYTEPS_ENABLE_ASYNC=1 each rank
instead pushes integer-valued deltas (asynchronous keys: the servers add each push once;
integer sums are exact in any order) and checks the final values against the exact sum
of every rank's deltas: a push added twice or lost after a failover shows.

With ``kill_step >= 0`` rank 0 sends SIGKILL to the last server of the address book
right after starting that step's push_pulls (their partitions are in flight).
FAILOVER_REINIT_AT=N: every rank calls shutdown() and init() after step N (the group
re-forms; the same steps follow).  Each rank writes out_dir/rank<r>.json (digest of the
final parameters, steps, error) and rank 0 out_dir/params.npz.
"""
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, steps, kill_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SHAPES = {"layer0.w": (200_000,), "layer1.w": (300, 70), "bias": (17,), "fp16.w": (70_000,)}
COMP = {"fp16.w": {"compressor": "fp16"}}
ASYNC = os.environ.get("BYTEPS_ENABLE_ASYNC") == "1"
REINIT_AT = int(os.environ.get("FAILOVER_REINIT_AT", "-1"))   # shutdown() + init() there

bps.init()
r, n = bps.rank(), bps.size()
params = {k: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s)
          for k, s in SHAPES.items()}


def grad(name: str, step: int) -> np.ndarray:
    rng = np.random.default_rng([r, step, len(name)])
    g = rng.standard_normal(SHAPES[name]).astype(np.float32)
    return g + np.float32(0.01) * params[name]


def delta(rank: int, name: str, step: int) -> np.ndarray:
    rng = np.random.default_rng([rank, step, len(name), 7])
    return rng.integers(-4, 5, SHAPES[name]).astype(np.float32)


def run_async() -> None:
    from byteps.core import api
    for step in range(steps):
        handles = {k: bps.push_pull_async(delta(r, k, step), name=k, average=False)
                   for k in SHAPES if k not in COMP}
        kill(step)
        for h in handles.values():
            bps.synchronize(h)
        res["steps"] = step + 1
        time.sleep(0.01)
    api.push_pull(np.ones(1, np.float32), "done", average=False)   # synchronous: all pushed
    bad = []
    for k in SHAPES:
        if k in COMP:
            continue
        got = bps.push_pull(np.zeros(SHAPES[k], np.float32), name=k, average=False)
        exp = sum(delta(q, k, s) for q in range(n) for s in range(steps))
        if not np.array_equal(got, exp):
            bad.append(f"{k}: max error {float(np.max(np.abs(got - exp)))}")
    res["async_mismatch"] = bad


def kill(step: int) -> None:
    if step == kill_step and r == 0:
        from byteps.core import api
        victim = api._STATE.engine.server_info[-1]
        os.kill(victim["pid"], signal.SIGKILL)
        res["killed"] = victim["pid"]
        print(f"rank 0: killed server pid {victim['pid']} at step {step}", flush=True)


res = {"rank": r, "error": None, "steps": 0}
try:
    if ASYNC:
        run_async()
    for step in range(0 if ASYNC else steps):
        handles = {k: bps.push_pull_async(grad(k, step), name=k,
                                          compression_params=COMP.get(k)) for k in SHAPES}
        kill(step)
        for k, h in handles.items():
            params[k] -= np.float32(0.1) * bps.synchronize(h)
        res["steps"] = step + 1
        if step + 1 == REINIT_AT:        # the group re-forms (a new epoch) without the server
            bps.shutdown()
            bps.init()
        time.sleep(0.01)
    res["digest"] = hashlib.sha256(b"".join(params[k].tobytes() for k in SHAPES)).hexdigest()
    if r == 0:
        np.savez(os.path.join(out_dir, "params.npz"), **params)
except bps.BytePSError as exc:
    res["error"] = str(exc)
    raise
finally:
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(res, f)
bps.shutdown()

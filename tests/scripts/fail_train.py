"""Worker script for the failure/robustness tests: argv = out_dir steps [mode].

Each step push_pulls three tensors of deterministic data and checks the
result exactly (2 workers: a + b is exact in IEEE arithmetic) or closely.
Writes out_dir/pid.rank<r> at start, out_dir/ready.rank<r> after step 2 and
out_dir/rank<r>.json at the end (or with the error when BytePS failed).

Modes: ``train`` (default); ``idle:R:K`` rank R stops calling BytePS at step K
(sleeps for an hour; ``idle:R:K:ignore`` also ignores SIGINT); ``dup`` rank 0
pushes a name that is still in flight.
Env: FAIL_STEP_SLEEP seconds between steps; FAIL_UNTIL_FILE: after step 3, stop
(at the same step on every rank) once this file exists.
"""
import hashlib
import json
import os
import sys
import time
import zlib

import numpy as np

import byteps.numpy as bps

out_dir, steps = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "train"
pause = float(os.environ.get("FAIL_STEP_SLEEP", "0"))
until = os.environ.get("FAIL_UNTIL_FILE")
SHAPES = {"layer0.w": (3000,), "layer1.w": (300, 70), "bias": (17,)}

bps.init()
r, n = bps.rank(), bps.size()
with open(os.path.join(out_dir, f"pid.rank{r}"), "w") as f:
    f.write(str(os.getpid()))


def data(rank: int, step: int, name: str) -> np.ndarray:
    rng = np.random.default_rng([rank, step, zlib.crc32(name.encode())])
    return rng.standard_normal(SHAPES[name]).astype(np.float32)


def write(res: dict) -> None:
    from byteps.core import api
    eng = api._STATE.engine if api._STATE is not None else None
    if eng is not None:
        res.update(dropped=eng.dropper.dropped, resends=eng.resends)
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(res, f)


res = {"rank": r, "failures": [], "error": None}
digest = hashlib.sha256()
idle = mode.split(":") if mode.startswith("idle:") else None
try:
    if mode == "dup":
        if r != 0:          # rank 0's push stays in flight until this one comes (a loaded
            time.sleep(0.5)  # CI run once had it complete before rank 0 pushed it again)
        h = bps.push_pull_async(data(r, 0, "bias"), name="dup.t")
        if r == 0:
            try:
                bps.push_pull_async(data(r, 1, "bias"), name="dup.t")
                res["dup_error"] = None
            except bps.BytePSError as exc:
                res["dup_error"] = str(exc)
        got = bps.synchronize(h)
        exp = np.divide(sum(data(k, 0, "bias") for k in range(n)), n)
        if not np.allclose(got, exp, rtol=1e-5, atol=1e-6):
            res["failures"].append("dup.t")
        steps = 2
    for step in range(steps):
        if idle and r == int(idle[1]) and step == int(idle[2]):
            open(os.path.join(out_dir, f"idle.rank{r}"), "w").close()
            if idle[3:] == ["ignore"]:
                import signal
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            time.sleep(3600)
        handles = {name: bps.push_pull_async(data(r, step, name), name=name) for name in SHAPES}
        for name, h in handles.items():
            got = bps.synchronize(h)
            acc = data(0, step, name)
            for k in range(1, n):
                acc = np.add(acc, data(k, step, name))
            exp = np.divide(acc, np.float32(n)) if n > 1 else acc
            ok = np.array_equal(got, exp) if n <= 2 else np.allclose(got, exp, 1e-5, 1e-6)
            if not ok:
                res["failures"].append(f"step {step} {name}")
            digest.update(got.tobytes())
        if step == 2:
            open(os.path.join(out_dir, f"ready.rank{r}"), "w").close()
        if pause:
            time.sleep(pause)
        if until and step >= 3:     # agree on the last step: sum of "file seen" flags
            seen = bps.push_pull(np.array([os.path.exists(until)], np.int32), name="until",
                                 average=False)
            if seen[0] > 0:
                steps = step + 1
                break
    res["digest"] = digest.hexdigest()
    res["steps"] = steps
except bps.BytePSError as exc:
    res["error"] = str(exc)
    write(res)
    raise
write(res)

"""Worker script: the checkpoint-resume pattern under bpslaunch --max-restarts.

    restart_worker.py OUT_DIR STEPS CRASH_STEP

Rank 0 saves (params, next step) every 10 steps (write, then rename: a checkpoint is
complete or absent); every rank starts from it when it exists.  Rank 1 crashes once at
CRASH_STEP (only while OUT_DIR/crashed does not exist yet).
"""
import json
import os
import sys

import numpy as np

import byteps.numpy as bps

out_dir, steps, crash_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ckpt = os.path.join(out_dir, "ckpt.npz")
marker = os.path.join(out_dir, "crashed")
bps.init()
r, n = bps.rank(), bps.size()
w, start = np.zeros(1000, np.float32), 0
if os.path.exists(ckpt):
    with np.load(ckpt) as z:
        w, start = z["w"], int(z["step"])
for s in range(start, steps):
    if r == 1 and s == crash_step and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"simulated crash at step {s}")
    g = (((np.arange(1000) * (r + 1) + 3 * s) % 17) - 8).astype(np.float32) / 4
    w -= np.float32(0.5) * bps.push_pull(g, name="g")
    if r == 0 and (s + 1) % 10 == 0:
        with open(ckpt + ".tmp", "wb") as f:
            np.savez(f, w=w, step=s + 1)
        os.replace(ckpt + ".tmp", ckpt)
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"w": w.tolist(), "start": start,
               "restart": int(os.environ.get("BYTEPS_RESTART_COUNT", "0"))}, f)
bps.shutdown()

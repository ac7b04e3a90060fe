"""Worker script: train until interrupted; the KeyboardInterrupt handler writes a file.

    sigint_worker.py OUT_DIR [stubborn]

Rank 0 re-raises KeyboardInterrupt after writing (the process then dies of SIGINT), the
others return normally; with ``stubborn`` rank 1 ignores the interrupt and sleeps on
(bpslaunch's SIGTERM after --grace-period must end it).

bpslaunch sends SIGINT to every worker at once, but on a loaded machine a rank may be
scheduled late: a peer that already handled its interrupt and exited then fails this
rank's push_pull first (naming the peer).  Such a rank waits for its own interrupt, which
must still arrive within the grace period (the test checks that every rank got it).
"""
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir = sys.argv[1]
stubborn = sys.argv[2:] == ["stubborn"]
bps.init()
r = bps.rank()
step = 0


def interrupted(how: str) -> None:
    with open(os.path.join(out_dir, f"interrupted.rank{r}"), "w") as f:
        f.write(f"{os.getpid()} {step}{how}")
    if stubborn and r == 1:
        while True:
            time.sleep(1)
    if r == 0:
        raise KeyboardInterrupt


try:
    try:
        while True:
            bps.push_pull(np.ones(1000, np.float32), name="g")
            step += 1
            if step == 1:
                with open(os.path.join(out_dir, f"ready.rank{r}"), "w") as f:
                    f.write(str(os.getpid()))
            time.sleep(0.02)
    except bps.BytePSError as e:
        if "exited" not in str(e) and "left" not in str(e):
            raise
        time.sleep(8)       # a peer handled its interrupt first: ours is on its way
        raise
except KeyboardInterrupt:
    interrupted("")

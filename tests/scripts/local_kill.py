"""Worker script: host0 local rank 1 kills itself with SIGKILL mid-training.

argv: out_dir.  Before dying it records the time and the job's shared-memory files.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps.core import api
from byteps.core.local.shm import job_prefix, shm_dir

out_dir = sys.argv[1]
bps.init()
cfg = api.get_config()
x = np.ones(50000, np.float32)
for step in range(1000):
    if step == 3 and cfg.host_id == "host0" and bps.local_rank() == 1:
        d = shm_dir(cfg.shm_dir)
        files = [f for f in os.listdir(d) if f.startswith(job_prefix(cfg.job_id))]
        with open(f"{out_dir}/killed.json", "w") as f:
            json.dump({"t": time.time(), "files": files}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    bps.push_pull(x, name="w")
    time.sleep(0.02)

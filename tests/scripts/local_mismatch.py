"""Worker script: local rank 1 pushes a different shape under the name 'bad'."""
import time

import numpy as np

import byteps.numpy as bps

bps.init()
n = 10 if bps.local_rank() == 0 else 12
if bps.local_rank() == 1:
    time.sleep(0.5)          # rank 0 creates the shared buffer first
bps.push_pull(np.ones(n, np.float32), name="bad")

"""Worker script for tests/test_horovodrun_cli.py: what horovodrun's options became in this
worker's config.  argv: out_dir.  Writes out_dir/rank<r>.json."""
import json
import os
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import state

bps.init()
cfg = state._state().cfg
total = bps.allreduce(np.ones(2, np.float32), name="x", average=False)
doc = {"rank": bps.rank(), "size": bps.size(), "local_size": bps.local_size(),
       "timeline": cfg.timeline, "marks": cfg.timeline_mark_cycles,
       "fusion": cfg.fusion_bytes, "autotune_steps": cfg.autotune_steps,
       "stall_warning_s": cfg.stall_warning_s, "sum": total.tolist(),
       "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}}
bps.shutdown()
with open(os.path.join(sys.argv[1], f"rank{doc['rank']}.json"), "w") as f:
    json.dump(doc, f)

"""Print BytePS's rank next to the torchrun-style variables bpslaunch set (one JSON line)."""
import json
import os
import sys

import byteps.numpy as bps

before = {k: os.environ.get(k) for k in ("HOROVOD_RANK", "HOROVOD_SIZE")}   # horovodrun's
bps.init()
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
doc = {"rank": bps.rank(), "size": bps.size(), "local_rank": bps.local_rank(),
       "local_size": bps.local_size(), "before_init": before, "env": {k: os.environ.get(k) for k in names},
       "other": {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "FORWARD_ME",
                                                 "CUDA_VISIBLE_DEVICES")}}
out = sys.argv[1] if len(sys.argv) > 1 else None
if out:
    with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
        json.dump(doc, f)
print("RANKENV " + json.dumps(doc), flush=True)
bps.shutdown()

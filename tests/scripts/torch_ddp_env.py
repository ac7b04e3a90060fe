"""A torchrun-style script under bpslaunch (tests/test_torchrun_env.py): torch.distributed's
default env:// rendezvous (MASTER_ADDR/MASTER_PORT), a default DistributedSampler and a
gloo all_reduce, next to BytePS's own rank; one JSON line per worker into OUT/rank<r>.json."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

import byteps.numpy as bps

dist.init_process_group("gloo")
sampler = DistributedSampler(TensorDataset(torch.arange(10)), shuffle=False)
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
bps.init()
doc = {"rank": dist.get_rank(), "world": dist.get_world_size(), "bps_rank": bps.rank(),
       "bps_size": bps.size(), "indices": list(sampler), "sum": t.item(),
       "master": [os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]]}
with open(os.path.join(sys.argv[1], f"rank{bps.rank()}.json"), "w") as f:
    json.dump(doc, f)
bps.shutdown()
dist.destroy_process_group()

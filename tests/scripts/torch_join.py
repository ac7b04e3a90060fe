"""Worker script: PyTorch DistributedOptimizer with uneven data and hvd-style join().

    torch_join.py OUT_DIR STEPS,STEPS,...

Rank r trains STEPS[r] batches of a linear model, joins, then broadcasts the parameters
from the last rank to join (Horovod's pattern) and writes them.
"""
import json
import os
import sys

import torch

import byteps.torch as bps

out_dir, steps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
bps.init()
torch.set_num_threads(1)
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 3)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
bps.broadcast_parameters(model.state_dict(), root_rank=0)


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 3, generator=g)


for s in range(steps[r]):
    x, y = batch(r, s)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
last = bps.join()
bps.broadcast_parameters(model.state_dict(), root_rank=last)
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump({"last": last, "params": {k: v.tolist() for k, v in model.state_dict().items()}},
              f)
bps.shutdown()

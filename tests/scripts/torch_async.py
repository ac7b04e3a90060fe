"""Worker script: asynchronous training (BYTEPS_ENABLE_ASYNC=1) with the original API.

Every rank fits a linear model on its own shard of one regression problem with
``bps.DistributedOptimizer``; the servers hold the parameters.  Afterwards the
parameters are broadcast from rank 0 and each rank writes its loss on the whole
data set and a digest of the parameters to OUT_DIR/rank<r>.json.
"""
import hashlib
import json
import sys

import torch

import byteps.torch as bps
from byteps.torch.parallel import DistributedDataParallel

torch.set_num_threads(1)
bps.init()
r, w = bps.rank(), bps.size()
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 8, generator=g)
true_w = torch.arange(1.0, 9.0).reshape(8, 1)
y = x @ true_w + 0.5
torch.manual_seed(100 + r)                      # different starts: rank 0's are seeded
model = torch.nn.Linear(8, 1)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
start = hashlib.sha256(model.weight.detach().numpy().tobytes()).hexdigest()
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
refused = ""
try:
    DistributedDataParallel(torch.nn.Linear(2, 2))
except bps.BytePSError as exc:
    refused = str(exc)
xs, ys = x[r::w], y[r::w]
for step in range(60):
    i = (step * 16) % len(xs)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(xs[i:i + 16]), ys[i:i + 16]).backward()
    opt.step()
bps.broadcast_parameters(model.state_dict(), root_rank=0)
obj = bps.broadcast_object({"step": 60, "w": model.weight.detach()} if r == 0 else None)
with torch.no_grad():
    loss = float(torch.nn.functional.mse_loss(model(x), y))
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump({"loss": loss, "start": start, "refused": refused,
               "params": hashlib.sha256(model.weight.detach().numpy().tobytes()).hexdigest(),
               "obj_ok": obj["step"] == 60 and torch.equal(obj["w"], model.weight.detach())}, f)
bps.shutdown()

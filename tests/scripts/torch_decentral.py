"""Worker for tests/test_decentralized.py: byteps.torch's DistributedOptimizer with the
decentralized algorithms on the digits MLP.  argv = out_dir.  Writes rank<r>.json."""
import json
import sys
import time

import numpy as np
import torch

import byteps.torch as bps
from digits_mlp import digits

torch.set_num_threads(1)
out_dir = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
x, y, xt, yt = digits()
xs, ys = torch.tensor(x[r::n]), torch.tensor(y[r::n])
res = {}
for name, alg in (("shift_one", bps.algorithms.Decentralized(peer_selection="shift_one")),
                  ("lowp", bps.algorithms.LowPrecisionDecentralized())):
    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=[(f"{name}.{k}", v) for k, v in
                                                     model.named_parameters()],
                                   algorithm=alg)
    t0 = time.monotonic()
    for epoch in range(15):
        for i in range(0, len(xs) - 31, 32):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[i:i + 32]), ys[i:i + 32])
            loss.backward()
            opt.step()
    opt.finish()
    with torch.no_grad():
        acc = float((model(torch.tensor(xt)).argmax(1).numpy() == yt).mean())
    res[name] = {"acc": acc, "seconds": time.monotonic() - t0,
                 "digest": float(sum(float(np.abs(p.detach().numpy()).sum())
                                     for p in model.parameters()))}
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

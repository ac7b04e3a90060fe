"""Worker script: digits with bps.QAdamOptimizer under DistributedOptimizer vs Adam.

Writes accuracy, a weight digest and the momentum's wire bytes per rank."""
import hashlib
import json
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.torch as bps

out_dir = sys.argv[1]
bps.init()
torch.set_num_threads(1)
r, n = bps.rank(), bps.size()
d = load_digits()
x_tr, x_te, y_tr, y_te = train_test_split((d.data / 16).astype(np.float32), d.target,
                                          test_size=0.25, random_state=0, stratify=d.target)
x_tr, y_tr, x_te = torch.from_numpy(x_tr), torch.from_numpy(y_tr).long(), torch.from_numpy(x_te)


def train(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
    else:
        opt = bps.QAdamOptimizer(model.parameters(), lr=0.003, warmup_steps=20)
    opt = bps.DistributedOptimizer(opt, named_parameters=[(f"{kind}.{k}", v) for k, v in
                                                          model.named_parameters()])
    bps.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"P.{kind}.")
    for epoch in range(8):
        perm = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(epoch))
        for s in range(0, len(perm) - 32 * n + 1, 32 * n):
            idx = perm[s + 32 * r:s + 32 * (r + 1)]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = float((model(x_te).argmax(1).numpy() == y_te).mean())
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    return acc, h.hexdigest()


res = {k: train(k) for k in ("adam", "qadam")}
_, _, table = bps.get_pushpull_speed(per_tensor=True)
mom = [v for k, v in table.items() if k.startswith("QAdam.exp_avg.qadam.0.weight")]
res["momentum_bytes"] = mom[0] if mom else None
bps.shutdown()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)

"""Worker script for tests/test_adasum.py: allreduce(op=Adasum) and the Adasum optimizer.

argv: out_dir mode.  mode "allreduce": every plugin's core allreduce with op=Adasum on
seeded per-rank vectors; "torch": byteps.torch.DistributedOptimizer(op=hvd.Adasum) for 3
steps of a seeded linear model (rank-dependent data); "numpy": the numpy optimizer with
algorithm=Adasum.  Writes out_dir/rank<r>.json."""
import json
import os
import sys

import numpy as np

out_dir, mode = sys.argv[1], sys.argv[2]
doc = {}
if mode == "allreduce":
    import byteps.numpy as bps
    bps.init()
    r = bps.rank()
    if bps.size() & (bps.size() - 1):        # 3 ranks: refused on every rank
        try:
            bps.allreduce(np.ones(2, np.float32), name="three", op=bps.Adasum)
            doc["refused"] = None
        except ValueError as exc:
            doc["refused"] = str(exc)
        bps.allreduce(np.ones(2, np.float32), name="after")     # the job goes on
        bps.shutdown()
        with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
            json.dump(doc, f)
        sys.exit(0)
    rng = np.random.default_rng(100 + r)
    for dt in ("float32", "float64", "float16"):
        x = rng.standard_normal((3, 5)).astype(dt)
        got = bps.allreduce(x, name=f"x.{dt}", op=bps.Adasum)
        doc[dt] = {"mine": x.tolist(), "got": got.tolist(), "dtype": str(got.dtype)}
    scaled = bps.allreduce(np.full(4, r + 1.0, np.float32), name="s", op=bps.Adasum,
                           prescale_factor=2.0, postscale_factor=0.5)
    doc["scaled"] = scaled.tolist()
    for bad, arr in (("int", np.ones(3, np.int32)),):
        try:
            bps.allreduce(arr, name="bad." + bad, op=bps.Adasum)
            doc["bad_" + bad] = "accepted"
        except ValueError as exc:
            doc["bad_" + bad] = str(exc)
    bps.shutdown()
elif mode == "torch":
    import torch
    import byteps.torch as hvd
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    with torch.no_grad():                 # a rank-dependent start, then the broadcast
        model.weight.add_(r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(10 + r)
    for step in range(3):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    doc = {"weight": model.weight.detach().tolist(), "bias": model.bias.detach().tolist()}
    hvd.shutdown()
elif mode == "numpy":
    import byteps.numpy as bps
    bps.init()
    r = bps.rank()
    w = np.zeros(3)

    def sgd(params, grads):
        params["w"] -= 0.5 * grads["w"]
    opt = bps.DistributedOptimizer(sgd, {"w": w}, algorithm=bps.algorithms.Adasum())
    opt.step({"w": np.eye(3)[r % 3] + 0.1 * r})
    doc = {"w": w.tolist()}
    bps.shutdown()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(doc, f)

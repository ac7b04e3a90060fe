"""Worker script for tests/test_compose_async.py: asynchronous training composed with
compression and local reduction.  Writes OUT_DIR/rank<r>.json.

    compose_async.py OUT_DIR numpy  COMP     numpy DistributedOptimizer, AsyncPS(COMP)
                                             (BYTEPS_ENABLE_ASYNC=1), plus raw async
                                             push_pulls of a compressed name
    compose_async.py OUT_DIR torch  COMP     torch DistributedOptimizer(compression_params=
                                             COMP) under BYTEPS_ENABLE_ASYNC=1
    compose_async.py OUT_DIR sync   COMP     torch, synchronous (SyncPS) with COMP

COMP is a JSON dict of compression_params or "none".  Every mode trains the digits MLP
on the rank's shard and reports test accuracy, a digest of the final parameters and the
bytes this rank pushed before/after compression.
"""
import json
import sys

import numpy as np

out_dir, mode, comp = sys.argv[1], sys.argv[2], sys.argv[3]
comp = None if comp == "none" else json.loads(comp)
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from digits_mlp import accuracy, digits, init_params  # noqa: E402
from digits_mlp import grads as mlp_grads  # noqa: E402

EPOCHS, LR, BATCH = 12, 0.2, 32


def wire_bytes(core) -> tuple[int, int]:
    """(raw, on the wire) bytes this rank pushed for the training tensors."""
    _, _, table = core.get_pushpull_speed(per_tensor=True)
    rows = [b for n, b in table.items() if "Async" in n or "Gradient" in n]
    return sum(b["pushed"] for b in rows), sum(b["pushed_wire"] for b in rows)


def train_numpy(res: dict) -> None:
    import byteps.numpy as bps
    from byteps.core import api
    bps.init()
    r, n = bps.rank(), bps.size()
    res["rank"] = r
    # the raw numpy API: asynchronous push_pulls of a compressed name (fp16 is exact on
    # these small integers: 3 pushes of r + 1 per rank)
    for _ in range(3):
        bps.push_pull(np.full(70_000, r + 1.0, np.float32), name="raw.fp16", average=False,
                      compression_params={"compressor": "fp16"})
    bps.barrier()
    res["raw"] = float(bps.push_pull(np.zeros(70_000, np.float32), name="raw.fp16",
                                     average=False)[0])
    x, y, xt, yt = digits()
    p = init_params(r)

    def sgd(params, grads):
        for k in params:
            params[k] -= LR * grads[k]
    opt = bps.DistributedOptimizer(sgd, p, algorithm=bps.algorithms.AsyncPS(
        compression_params=comp))
    xs, ys = x[r::n], y[r::n]
    for _ in range(EPOCHS):
        for i in range(0, len(xs) - BATCH + 1, BATCH):
            opt.step(mlp_grads(p, xs[i:i + BATCH], ys[i:i + BATCH]))
    opt.finish()
    res["acc"] = accuracy(p, xt, yt)
    res["digest"] = float(sum(float(np.abs(v).sum()) for v in p.values()))
    res["raw_bytes"], res["wire_bytes"] = wire_bytes(api)
    bps.shutdown()


def train_torch(res: dict) -> None:
    import torch

    import byteps.torch as bps
    from byteps.core import api
    torch.set_num_threads(1)
    bps.init()
    r, n = bps.rank(), bps.size()
    res["rank"] = r
    x, y, xt, yt = (torch.from_numpy(np.asarray(a)) for a in digits())
    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   compression_params=comp)
    res["algorithm"] = opt.algorithm.describe()
    xs, ys = x[r::n], y[r::n]
    for _ in range(EPOCHS):
        for i in range(0, len(xs) - BATCH + 1, BATCH):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[i:i + BATCH]),
                                                     ys[i:i + BATCH])
            loss.backward()
            opt.step()
    if hasattr(opt, "finish"):
        opt.finish()
    with torch.no_grad():
        res["acc"] = float((model(xt).argmax(1) == yt).float().mean())
        res["digest"] = float(sum(float(p.abs().sum()) for p in model.parameters()))
    res["raw_bytes"], res["wire_bytes"] = wire_bytes(api)
    bps.shutdown()


result: dict = {}
(train_numpy if mode == "numpy" else train_torch)(result)
with open(f"{out_dir}/rank{result['rank']}.json", "w") as f:
    json.dump(result, f)

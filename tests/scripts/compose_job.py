"""Worker for tests/test_compose_algorithms.py: every algorithm receives the compressor
(issue 24).  argv = out_dir plugin mode [args].  Writes OUT_DIR/rank<r>.json.

``numpy train ALGS`` / ``torch train ALGS``: the digits MLP trained by each
comma-separated algorithm (names below) in turn: accuracy, digest and a digest taken
before finish().  ``numpy join ALGS STEPS``: each algorithm, rank r trains
STEPS[r] steps, then join(), then finish(); the parameters before join() and at the end.
"""
import json
import os
import sys
import time

import numpy as np

from digits_mlp import accuracy, digits, grads, init_params

out_dir, plugin, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if plugin == "torch":
    import torch

    import byteps.torch as bps
    torch.set_num_threads(1)
else:
    import byteps.numpy as bps
bps.init()
r, n = bps.rank(), bps.size()
A = bps.algorithms
ONEBIT = {"compressor": "onebit", "ef": "vanilla"}
INT8 = {"compressor": "int8"}
EPOCHS = int(os.environ.get("COMPOSE_EPOCHS", "12"))


def make(name):
    """(algorithm, the optimizer's compression_params, backward_passes_per_step)."""
    return {
        "sync": lambda: (A.SyncPS(), None, 1),
        "avg_onebit": lambda: (A.AsyncModelAverage(sync_interval_ms=5), ONEBIT, 1),
        "avg_int8_own": lambda: (A.AsyncModelAverage(sync_interval_ms=5,
                                                     compression_params=INT8), None, 1),
        "avg_bpps2": lambda: (A.AsyncModelAverage(sync_interval_ms=20), ONEBIT, 2),
        "dec_int8": lambda: (A.Decentralized("shift_one"), INT8, 1),
        "dec_all_onebit": lambda: (A.Decentralized("all", gamma=0.5), ONEBIT, 1),
        "lowp": lambda: (A.LowPrecisionDecentralized(), None, 1),
        "dec_all": lambda: (A.Decentralized("all"), None, 1),
        "dec_shift": lambda: (A.Decentralized("shift_one"), None, 1),
        "dec_ring_int8": lambda: (A.Decentralized("ring", compression_params=INT8), None, 1),
    }[name]()


def digest(arrs) -> float:
    return float(sum(float(np.abs(np.asarray(v, np.float64)).sum()) for v in arrs))


x, y, xt, yt = digits()
xs, ys = x[r::n], y[r::n]
res = {}


def numpy_train(name, steps=None):
    alg, cparams, passes = make(name)
    if cparams:                                  # the plugins' call: Algorithm.bind
        alg.bind(cparams, passes)
    p = init_params(0)
    lr = 0.2

    def sgd(params, g):
        for key in params:
            params[key] -= lr * g[key]
    opt = bps.DistributedOptimizer(sgd, {f"{name}.{k}": v for k, v in p.items()},
                                   algorithm=alg)
    q = {k: opt.params[f"{name}.{k}"] for k in p}
    t0, s = time.monotonic(), 0
    for epoch in range(EPOCHS if steps is None else 10 ** 6):
        for i in range(0, len(xs) - 31, 32):
            if steps is not None and s == steps:
                break
            g = grads(q, xs[i:i + 32], ys[i:i + 32])
            opt.step({f"{name}.{k}": v for k, v in g.items()})
            s += 1
            if name.startswith("avg"):           # steps long enough for many rounds
                time.sleep(0.004)
        if steps is not None and s == steps:
            break
    out = {"seconds": time.monotonic() - t0, "steps": s}
    if steps is not None:
        out["before_join"] = {k: v.tolist() for k, v in q.items() if k == "b2"}
        out["last"] = bps.join()
        out["after_join"] = {k: v.tolist() for k, v in q.items() if k == "b2"}
    out["own_acc"] = accuracy(q, xt, yt)        # this rank's model, before finish()
    out["rounds"] = getattr(alg, "rounds", getattr(alg, "comm", 0))
    opt.finish()
    out.update(acc=accuracy(q, xt, yt), digest=digest(q.values()))
    return out


def torch_train(name):
    alg, cparams, passes = make(name)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=[(f"{name}.{k}", v) for k, v in
                                                     model.named_parameters()],
                                   algorithm=alg, compression_params=cparams,
                                   backward_passes_per_step=passes)
    tx, ty = torch.tensor(xs), torch.tensor(ys)
    bs = 32 // passes
    t0 = time.monotonic()
    for epoch in range(EPOCHS):
        for i in range(0, len(xs) - 31, 32):
            opt.zero_grad()
            for j in range(passes):              # passes backward passes, one step
                sl = slice(i + j * bs, i + (j + 1) * bs)
                loss = torch.nn.functional.cross_entropy(model(tx[sl]), ty[sl]) / passes
                loss.backward()
            opt.step()
    opt.finish()
    with torch.no_grad():
        acc = float((model(torch.tensor(xt)).argmax(1).numpy() == yt).mean())
    return {"acc": acc, "seconds": time.monotonic() - t0, "desc": alg.describe(),
            "digest": digest(p.detach().numpy() for p in model.parameters())}


if mode == "train":
    for name in sys.argv[4].split(","):
        res[name] = (torch_train if plugin == "torch" else numpy_train)(name)
elif mode == "join":
    steps = [int(s) for s in sys.argv[5].split(",")]
    for name in sys.argv[4].split(","):
        res[name] = numpy_train(name, steps[r])
elif mode == "pset":                 # compression with a process set of ranks 0 and 1
    from byteps.core import api
    from byteps.core.collective import ops as collectives
    from byteps.core.collective import process_sets
    ps = process_sets.add_process_set([0, 1])
    api.declare("pset.g", compression_params=ONEBIT)
    if r in (0, 1):
        rng = np.random.default_rng(r)
        outs = []
        for t in range(3):
            g = rng.standard_normal(4096).astype(np.float32)
            outs.append(collectives.allreduce(g, name="pset.g", process_set=ps).tolist())
            res.setdefault("inputs", []).append(g.tolist())
        res["outs"] = outs
    api.barrier()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

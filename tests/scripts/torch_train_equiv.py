"""Worker script: W workers with byteps.torch vs one process on the concatenated batch.

Usage: torch_train_equiv.py OUT_DIR [phases...]; writes OUT_DIR/rank<r>.json with, per
phase, the max relative error against the single-process reference and a hash of
the parameters (which must be identical on every rank).
"""
import hashlib
import json
import sys

import torch

import byteps.torch as bps
from byteps.torch.parallel import DistributedDataParallel

torch.set_num_threads(1)
B, STEPS, DIM, CLASSES = 8, 4, 10, 3


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, CLASSES))


def batches(n_rows: int, steps: int):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(n_rows, DIM, generator=g), torch.randint(0, CLASSES, (n_rows,),
                                                                  generator=g))
            for _ in range(steps)]


OPTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def rel_err(model, ref) -> float:
    return max(float((a - b).norm() / b.norm().clamp_min(1e-12))
               for a, b in zip(model.parameters(), ref.parameters()))


def reference(opt_name: str, data, micro: int = 1):
    ref = make_model(1)
    opt = OPTS[opt_name](ref.parameters())
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    return ref


def shard(x, r, w, micro=1):
    """Rows of rank r: micro consecutive blocks of B rows each."""
    n = B * micro
    return x[r * n:(r + 1) * n]


def run_optimizer(opt_name: str, tag: str, micro: int = 1, compression=bps.Compression.none):
    r, w = bps.rank(), bps.size()
    data = batches(B * micro * w, STEPS)
    model = make_model(100 + r)              # different on purpose: broadcast must fix it
    opt = bps.DistributedOptimizer(OPTS[opt_name](model.parameters()),
                                   named_parameters=[(f"{tag}.{n}", p) for n, p in
                                                     model.named_parameters()],
                                   compression=compression, backward_passes_per_step=micro)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    ref0 = make_model(1)
    with torch.no_grad():                    # rank 0 starts from the reference's weights
        for p, q in zip(model.parameters(), ref0.parameters()):
            if r == 0:
                p.copy_(q)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in data:
        opt.zero_grad()
        xs, ys = shard(x, r, w, micro), shard(y, r, w, micro)
        for m in range(micro):
            sl = slice(m * B, (m + 1) * B)
            loss = torch.nn.functional.cross_entropy(model(xs[sl]), ys[sl]) / micro
            loss.backward()
        opt.step()
    return {"err": rel_err(model, reference(opt_name, data)), "hash": digest(model)}


def run_ddp():
    """DDP wrapper: one no_sync micro-batch plus one synchronised one per step."""
    r, w = bps.rank(), bps.size()
    data = batches(B * 2 * w, STEPS)
    model = make_model(1 if r == 0 else 200)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad()
        xs, ys = shard(x, r, w, 2), shard(y, r, w, 2)
        with ddp.no_sync():
            (torch.nn.functional.cross_entropy(ddp(xs[:B]), ys[:B]) / 2).backward()
        (torch.nn.functional.cross_entropy(ddp(xs[B:]), ys[B:]) / 2).backward()
        opt.step()
    ref = make_model(1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        ropt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ropt.step()
    return {"err": rel_err(model, ref), "hash": digest(model)}


def run_unused():
    """A parameter only rank 0 uses still takes part: rank 1 contributes zeros."""
    r, w = bps.rank(), bps.size()
    torch.manual_seed(3)
    main, aux = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    params = list(main.parameters()) + list(aux.parameters())
    opt = bps.DistributedOptimizer(torch.optim.SGD(params, lr=0.5))
    x = torch.ones(3, 4) * (r + 1)
    loss = main(x).sum() + (aux(x).sum() if r == 0 else 0)
    loss.backward()
    opt.step()
    # d/dW of sum(aux(x)) on rank 0 is 3 (rows of ones) everywhere; rank 1 adds zeros.
    return {"aux_grad": aux.weight.grad.tolist(), "expected": [[3.0 / w] * 4] * 2,
            "hash": digest(main) + digest(aux)}


def run_fp16_ints():
    t = torch.arange(10, dtype=torch.int64) * (bps.rank() + 1)
    out = bps.push_pull(t, average=False, name="ints.fp16", compression=bps.Compression.fp16)
    f = torch.linspace(-3, 3, 50) * (bps.rank() + 1)
    fo = bps.push_pull(f, average=True, name="floats.fp16", compression=bps.Compression.fp16)
    w = bps.size()
    exp = torch.linspace(-3, 3, 50) * (w + 1) / 2
    return {"int_dtype": str(out.dtype), "ints": out.tolist(),
            "float_dtype": str(fo.dtype), "float_err": float((fo - exp).abs().max()),
            "float_scale": float(exp.abs().max())}


def run_autograd():
    """push_pull is differentiable: the gradient is push_pulled (averaged) back."""
    r, w = bps.rank(), bps.size()
    x = torch.ones(3, requires_grad=True)
    y = bps.push_pull(x * (r + 1), name="autograd.y")
    (y * torch.tensor([1.0, 2.0, 3.0]) * (r + 1)).sum().backward()
    m = (w + 1) / 2                                    # mean of (r + 1) over ranks
    return {"y_ok": torch.allclose(y.detach(), torch.full((3,), m)),
            "grad_ok": torch.allclose(x.grad, (r + 1) * m * torch.tensor([1.0, 2.0, 3.0]))}


def main():
    out_dir = sys.argv[1]
    phases = sys.argv[2:] or ["sgd", "adam"]
    bps.init()
    res = {}
    for ph in phases:
        if ph in OPTS:
            res[ph] = run_optimizer(ph, ph)
        elif ph == "bpps2":
            res[ph] = run_optimizer("sgd", ph, micro=2)
        elif ph == "fp16":
            res[ph] = run_optimizer("sgd", ph, compression=bps.Compression.fp16)
        elif ph == "ddp":
            res[ph] = run_ddp()
        elif ph == "unused":
            res[ph] = run_unused()
        elif ph == "fp16_ints":
            res[ph] = run_fp16_ints()
        elif ph == "autograd":
            res[ph] = run_autograd()
        else:
            raise SystemExit(f"unknown phase {ph!r}")
    with open(f"{out_dir}/rank{bps.rank()}.json", "w") as f:
        json.dump(res, f)
    bps.shutdown()


if __name__ == "__main__":
    main()

"""Worker script: broadcast_parameters / broadcast_optimizer_state / broadcast_object.

Every rank starts from different weights, hyper-parameters and optimizer state
(the root may have stepped while the others have an empty state, or the other
way round).  After the broadcasts each rank writes digests of its parameters
and optimizer state, and of the parameters after one more identical step, to
OUT_DIR/rank<r>.json; the test checks they are equal on every rank.
"""
import hashlib
import json
import sys

import numpy as np
import torch

import byteps.torch as bps

torch.set_num_threads(1)

OPTS = {
    "sgd": lambda ps, r: torch.optim.SGD(ps, lr=0.1 * (r + 1), momentum=0.9),
    "adam": lambda ps, r: torch.optim.Adam(ps, lr=0.01 * (r + 1), betas=(0.9 - 0.1 * r, 0.99)),
    "adamw": lambda ps, r: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1 * (r + 1)),
    "rmsprop": lambda ps, r: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=r == 0),
    "adagrad": lambda ps, r: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=r),
}


def model_for(rank: int) -> torch.nn.Module:
    torch.manual_seed(10 + rank)
    return torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.BatchNorm1d(20),
                               torch.nn.ReLU(), torch.nn.Linear(20, 4))


def train(model, opt, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 12, generator=g)).pow(2).mean().backward()
        opt.step()


def state_digest(opt) -> str:
    sd = opt.state_dict()
    h = hashlib.sha256()
    for group in sd["param_groups"]:
        h.update(repr(sorted(group.items())).encode())
    for pid in sorted(sd["state"]):
        for k in sorted(sd["state"][pid]):
            v = sd["state"][pid][k]
            h.update(f"{pid}.{k}.".encode())
            h.update(v.numpy().tobytes() + str(v.dtype).encode() if torch.is_tensor(v)
                     else repr(v).encode())
    return h.hexdigest()


def params_digest(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode() + v.numpy().tobytes())
    return h.hexdigest()


def check_optimizer(name: str, root: int, root_steps: int, other_steps: int) -> dict:
    r = bps.rank()
    model = model_for(r)
    opt = OPTS[name](model.parameters(), r)
    train(model, opt, root_steps if r == root else other_steps, seed=r)
    if name == "adam":                       # the original BytePS style: a wrapped optimizer
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=root, prefix=f"P.{name}.{root}.")
    bps.broadcast_optimizer_state(opt, root_rank=root, prefix=f"S.{name}.{root}.")
    res = {"params": params_digest(model), "state": state_digest(opt),
           "nstate": len(opt.state_dict()["state"])}
    if isinstance(opt, torch.optim.Adam):
        train(model, opt, 1, seed=99)            # hooks push_pull identical gradients
    else:
        plain = OPTS[name](model.parameters(), 0)    # one identical step, received state
        plain.load_state_dict(opt.state_dict())
        train(model, plain, 1, seed=99)
    res["after_step"] = params_digest(model)
    return res


def check_object(root: int) -> str:
    obj = {"a": (1, 2.5, "x", None, True), 3: [np.arange(5, dtype=np.int16),
                                                torch.ones(2, 3, dtype=torch.bfloat16)],
           "s": np.float32(1.5), (1, "k"): {"nested": [b"\x00\xff", -7, 2 ** 62]},
           "empty": torch.zeros(0, 4), "big": torch.arange(5000, dtype=torch.float64)}
    if bps.rank() != root:
        obj = None
    got = bps.broadcast_object(obj, root_rank=root)
    assert isinstance(got["a"], tuple) and got["a"] == (1, 2.5, "x", None, True), got["a"]
    assert got[3][0].dtype == np.int16 and got[3][0].tolist() == list(range(5))
    assert got[3][1].dtype == torch.bfloat16 and got[3][1].shape == (2, 3)
    assert got[(1, "k")] == {"nested": [b"\x00\xff", -7, 2 ** 62]}
    assert got["empty"].shape == (0, 4) and float(got["big"].sum()) == sum(range(5000))
    return repr(got)


def main():
    out_dir = sys.argv[1]
    bps.init()
    res = {}
    last = bps.size() - 1
    for name in OPTS:
        res[f"{name}/root0"] = check_optimizer(name, 0, root_steps=2, other_steps=0)
        res[f"{name}/root{last}"] = check_optimizer(name, last, root_steps=0, other_steps=1)
    res["object0"] = check_object(0)
    res[f"object{last}"] = check_object(last)
    with open(f"{out_dir}/rank{bps.rank()}.json", "w") as f:
        json.dump(res, f)
    bps.shutdown()


if __name__ == "__main__":
    main()

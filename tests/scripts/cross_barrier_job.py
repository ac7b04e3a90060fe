"""CrossBarrier against DistributedOptimizer, in the original BytePS example's style.

    cross_barrier_job.py OUT PHASE...   (under bpslaunch)

Only ``import byteps.torch.cross_barrier as bps`` is imported from byteps, as the original
``example/pytorch/benchmark_cross_barrier_byteps.py`` does.  Each phase trains the same
model from the same start on the same per-rank batches twice: with ``bps.CrossBarrier``
and with ``bps.DistributedOptimizer``; OUT/rank<r>.json gets, per phase, the largest
difference between the two models' parameters, how many steps returned with updates
still in flight (the barrier crossed), and a checksum of the model for the ranks to agree.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import byteps.torch.cross_barrier as bps

STEPS = 8


class Net(nn.Module):
    """Nested modules, and a parameter of the parent module itself (used in its forward)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU())
        self.gain = nn.Parameter(torch.ones(384))
        self.head = nn.Linear(384, 10)

    def forward(self, x):
        return self.head(self.body(x) * self.gain)


class ConvNet(nn.Module):
    """The original example's kind of model (a ResNet): convolutions, batch norms (running
    statistics updated by each forward pass), a residual block."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        return self.head(x.mean((2, 3)))


def optimizer(phase, params):
    if phase in ("sgd", "fp16", "bpps2", "onebit", "join", "shutdown", "convbn", "addgroup",
                 "unfreeze"):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if phase == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if phase == "adamw":
        return torch.optim.AdamW(params, lr=2e-3, weight_decay=0.01)
    if phase == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, momentum=0.5)
    raise SystemExit(f"unknown phase {phase}")


def train(phase, cross, batches):
    torch.manual_seed(0)
    model = ConvNet() if phase == "convbn" else Net()
    if phase == "addgroup":      # the head joins at step 3 (progressive unfreezing)
        model.head.requires_grad_(False)
        opt = optimizer(phase, [p for n, p in model.named_parameters()
                                if not n.startswith("head.")])
    else:
        opt = optimizer(phase, model.parameters())
    if phase == "unfreeze":      # frozen at the start, unfrozen at step 3 (all in opt)
        model.head.requires_grad_(False)
    named = [(f"{phase}.{'cb' if cross else 'ref'}.{n}", p) for n, p in model.named_parameters()]
    compression = bps.Compression.fp16 if phase == "fp16" else bps.Compression.none
    bpps = 2 if phase == "bpps2" else 1
    cparams = {"compressor": "onebit", "ef": "vanilla"} if phase == "onebit" else None
    steps = STEPS - 3 * (bps.rank() % 2) if phase == "join" else STEPS   # uneven, then join()
    if cross:
        # "shutdown": no step waits; bps.shutdown() right after the last one must
        opt = bps.CrossBarrier(model, opt, named_parameters=named, compression=compression,
                               backward_passes_per_step=bpps,
                               num_steps=10**6 if phase == "shutdown" else STEPS,
                               compression_params=cparams)
    else:
        opt = bps.DistributedOptimizer(opt, named_parameters=named, compression=compression,
                                       backward_passes_per_step=bpps,
                                       compression_params=cparams)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    crossed, waited_mid = 0, None
    for step in range(steps):
        if phase == "addgroup" and step == 3:
            with torch.no_grad():        # each rank's own start: the group is broadcast
                model.head.weight.add_(bps.rank())
            model.head.requires_grad_(True)
            opt.add_param_group({"params": model.head.parameters(), "lr": 0.05})
        if phase == "unfreeze" and step == 3:
            model.head.requires_grad_(True)
        if phase == "unfreeze" and step == 5:     # frozen again: no gradient, no update
            model.gain.requires_grad_(False)
        opt.zero_grad()
        if phase == "shutdown" and cross and step == steps - 1 and bps.rank() == 1:
            time.sleep(0.3)     # rank 0's last updates wait for these pushes: in flight
        for x, y in batches[step * bpps:(step + 1) * bpps]:
            F.cross_entropy(model(x), y).backward()
        opt.step()
        if cross:
            crossed += opt._cb_inflight > 0
            if step == STEPS // 2:       # the model's state_dict waits for the updates
                model.state_dict()
                waited_mid = opt._cb_inflight == 0
        sched.step()
    if phase == "join":
        bps.join()
        if cross:
            opt.synchronize()
    if phase == "shutdown" and cross:
        inflight = opt._cb_inflight
        bps.shutdown()                   # the last step's updates are applied first
        return model, {"crossed": crossed, "waited_mid": waited_mid, "inflight": inflight,
                       "done": opt._cb_inflight == 0}
    done = (opt._cb_inflight == 0) if cross else True     # the step numbered num_steps waits
    return model, {"crossed": crossed, "waited_mid": waited_mid, "done": done}


def mismatch():
    """Rank 1's head has one more output: the exchange fails on the background thread and
    the error reaches every rank's training loop (not a hang); the job stays usable."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4 + (bps.rank() == 1)))
    # rank 1's backward pass pauses before the first layer's gradients, so its error is
    # back before it pushes them: it must push them all the same (as rank 0 does)
    def pause(_module, _inputs, out):
        if bps.rank() == 1 and out.requires_grad:
            out.register_hook(lambda g: time.sleep(0.5) or g)
    model[0].register_forward_hook(pause)
    opt = bps.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           named_parameters=[("mm." + n, p) for n, p in model.named_parameters()])
    error = None
    try:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        opt.synchronize()
    except bps.BytePSError as exc:
        error = str(exc)
    after = bps.push_pull(torch.full((3,), float(bps.rank())), name="mm.after").tolist()
    return {"error": error, "after": after}


def main():
    out, phases = sys.argv[1], sys.argv[2:]
    assert "shutdown" not in phases[:-1], "shutdown ends the job: the last phase"
    bps.init()
    rank = None
    res = {}
    for phase in phases:
        if phase == "mismatch":
            res[phase] = mismatch()
            continue
        g = torch.Generator().manual_seed(100 + bps.rank())
        shape = (8, 3, 12, 12) if phase == "convbn" else (16, 32)
        batches = [(torch.randn(*shape, generator=g),
                    torch.randint(0, 10, (shape[0],), generator=g)) for _ in range(2 * STEPS)]
        if phase == "shutdown":          # the last phase: the reference first
            ref, _ = train(phase, False, batches)
            rank = bps.rank()
            cb, info = train(phase, True, batches)
        else:
            cb, info = train(phase, True, batches)
            ref, _ = train(phase, False, batches)
        # parameters and buffers (batch norms' running statistics)
        pairs = list(zip(cb.state_dict().values(), ref.state_dict().values()))
        diff = max((a - b).abs().max().item() for a, b in pairs if a.is_floating_point())
        scale = max(b.abs().max().item() for _, b in pairs if b.is_floating_point())
        res[phase] = dict(info, diff=diff, scale=scale,
                          checksum=[round(p.double().sum().item(), 6) for p in cb.parameters()])
    rank = rank if "shutdown" in phases else bps.rank()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    bps.shutdown()


if __name__ == "__main__":
    main()

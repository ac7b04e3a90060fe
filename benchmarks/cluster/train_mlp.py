"""Synthetic training step for the cluster benchmark: byteps vs DDP (gloo), img/sec.

    python train_mlp.py --backend byteps|byteps-cb|ddp [--width 4096] [--batch 32] [--steps 8]

A wide MLP on random 'images' (3x32x32): communication-heavy on purpose
(29.4 M parameters = 118 MB of gradients per step at the default width).
byteps (DistributedOptimizer) and byteps-cb (``bps.CrossBarrier``) run under
``python -m byteps.launcher`` (DMLC_* from the cluster
runner); ddp reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.  Prints
``CLUSTER_RESULT {json}`` with this worker's img/sec.
"""
import argparse
import json
import os
import statistics
import time
from datetime import timedelta

import torch
from torch import nn


def model(width: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("byteps", "byteps-cb", "ddp"), required=True)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = model(a.width)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    if a.backend.startswith("byteps"):
        import byteps.torch as bps
        if a.backend == "byteps-cb":
            import byteps.torch.cross_barrier as bps
        bps.init()
        rank, size = bps.rank(), bps.size()
        bps.broadcast_parameters(net.state_dict(), root_rank=0)
        if a.backend == "byteps-cb":    # the last timed step waits for every update
            opt = bps.CrossBarrier(net, opt, named_parameters=net.named_parameters(),
                                   num_steps=a.warmup + a.steps)
        else:
            opt = bps.DistributedOptimizer(opt, named_parameters=net.named_parameters())
        run = net
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=120))
        rank, size = dist.get_rank(), dist.get_world_size()
        run = nn.parallel.DistributedDataParallel(net)
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))
    loss_fn = nn.CrossEntropyLoss()

    phases: list[tuple] = []     # wall and this thread's CPU: forward, backward, optimizer step

    def step():
        t0, c0 = time.perf_counter(), time.thread_time()
        opt.zero_grad()
        loss = loss_fn(run(x), y)
        t1, c1 = time.perf_counter(), time.thread_time()
        loss.backward()
        t2, c2 = time.perf_counter(), time.thread_time()
        opt.step()
        t3, c3 = time.perf_counter(), time.thread_time()
        phases.append((t1 - t0, t2 - t1, t3 - t2, c1 - c0, c2 - c1, c3 - c2))
        return loss

    for _ in range(a.warmup):
        step()
    if a.backend == "byteps-cb":    # the timed steps start with no update in flight, as
        opt.synchronize()           # DistributedOptimizer's (its step() waits for them)
    del phases[:]
    t = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t
    params = sum(p.numel() for p in net.parameters())
    print("CLUSTER_RESULT " + json.dumps({
        "system": a.backend, "rank": rank, "size": size, "img_sec": a.batch * a.steps / dt,
        "step_s": dt / a.steps, "model": f"mlp{a.width} ({params / 1e6:.1f} M params)",
        "batch": a.batch, "loss": float(loss),
        # medians over the timed steps: where a step's time goes on this worker (DDP's
        # all-reduce runs inside backward, byteps' push_pulls finish in the optimizer step)
        "phase_s": {k: statistics.median(p[i] for p in phases)
                    for i, k in enumerate(("forward", "backward", "opt_step", "forward_cpu",
                                           "backward_cpu", "opt_step_cpu"))}}), flush=True)
    if a.backend == "ddp":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

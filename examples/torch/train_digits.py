"""Train a small network on scikit-learn's digits with byteps.torch (no download).

    bpslaunch --standalone --num-workers 2 --num-servers 2 python examples/torch/train_digits.py

Each worker trains on its half of every global batch; gradients are averaged
through the parameter servers while backward still runs.  Prints the loss and
the test accuracy (counted over all workers' test shards) after every epoch.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import byteps.torch as bps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--fp16", action="store_true", help="compress gradients to float16")
    args = ap.parse_args()

    bps.init()
    torch.set_num_threads(1)
    rank, size = bps.rank(), bps.size()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25,
                                              random_state=0, stratify=digits.target)
    x_tr, y_tr = torch.from_numpy(x_tr), torch.from_numpy(y_tr).long()
    # every rank evaluates its own shard of the test set; the counts are summed
    x_te = torch.from_numpy(x_te[rank::size])
    y_te = torch.from_numpy(y_te[rank::size]).long()

    torch.manual_seed(rank)                  # different on purpose: rank 0's weights win
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = bps.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=bps.Compression.fp16 if args.fp16 else bps.Compression.none)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)

    gen = torch.Generator().manual_seed(1234)    # same shuffle on every rank
    global_batch = args.batch_size * size
    t0 = time.time()
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(x_tr), generator=gen)
        total, steps = 0.0, 0
        for start in range(0, len(perm) - global_batch + 1, global_batch):
            idx = perm[start + rank * args.batch_size:start + (rank + 1) * args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        model.eval()
        with torch.no_grad():
            correct = (model(x_te).argmax(1) == y_te).sum()
        stats = torch.tensor([total / steps, float(correct), float(len(y_te))],
                             dtype=torch.float64)
        stats = bps.push_pull(stats, average=False, name="digits.stats")
        if rank == 0:
            print(f"epoch {epoch:2d}  loss={stats[0].item() / size:.4f}  "
                  f"test_acc={stats[1].item() / stats[2].item():.4f}  "
                  f"({time.time() - t0:.1f} s)", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()

# ruff: noqa  -- written in the original BytePS example style on purpose (py2-era idioms)
"""A training script written against the ORIGINAL BytePS PyTorch API (unchanged style).

Modelled on byteps/example/pytorch/train_mnist_byteps.py: the calls below are the
ones such scripts make; only the synthetic data set is ours (no download).
"""
from __future__ import print_function

import argparse
import hashlib
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import byteps.torch as bps

parser = argparse.ArgumentParser(description="PyTorch BytePS example")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--fp16-pushpull", action="store_true", default=True)
parser.add_argument("--out", default=None)
args = parser.parse_args()

bps.init()
torch.manual_seed(42 + bps.rank())
torch.set_num_threads(1)

g = torch.Generator().manual_seed(0)
X = torch.randn(512, 1, 8, 8, generator=g)
Y = (X.mean(dim=(1, 2, 3)) > 0).long() + 2 * (X[:, 0, 0, 0] > 0).long()
train_dataset = torch.utils.data.TensorDataset(X, Y)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=bps.size(), rank=bps.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                           sampler=train_sampler)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * bps.size(), momentum=args.momentum)

# BytePS: (optional) compression algorithm.
compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none

# BytePS: wrap optimizer with DistributedOptimizer.
optimizer = bps.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression)

# BytePS: broadcast parameters.
bps.broadcast_parameters(model.state_dict(), root_rank=0)
bps.broadcast_optimizer_state(optimizer, root_rank=0)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = bps.push_pull(tensor, name=name)
    return avg_tensor.item()


losses = []
for epoch in range(1, args.epochs + 1):
    model.train()
    train_sampler.set_epoch(epoch)
    total = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    avg = metric_average(total / len(train_loader), "avg_loss")
    losses.append(avg)
    if bps.rank() == 0:
        print("Train Epoch: {} \tLoss: {:.6f}".format(epoch, avg))

if args.out:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    with open(os.path.join(args.out, "rank%d.json" % bps.rank()), "w") as f:
        json.dump({"params": h.hexdigest(), "first_loss": losses[0], "final_loss": losses[-1]},
                  f)

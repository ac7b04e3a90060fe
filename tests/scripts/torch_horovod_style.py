# ruff: noqa  -- a Horovod example (examples/pytorch/pytorch_mnist.py style) on purpose
"""A training script written for Horovod; the only change is the import line.

Synthetic data instead of MNIST (no download).  Writes OUT/rank<r>.json.
"""
import argparse
import hashlib
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import byteps.torch as hvd          # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description='PyTorch Horovod-style example')
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--lr', type=float, default=0.05)
parser.add_argument('--momentum', type=float, default=0.5)
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--use-adasum', action='store_true', default=False)
parser.add_argument('--gradient-predivide-factor', type=float, default=1.0)
parser.add_argument('--out', default=None)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

g = torch.Generator().manual_seed(0)
X = torch.randn(512, 20, generator=g)
Y = (X[:, :10].sum(1) > 0).long() + 2 * (X[:, 10:].sum(1) > 0).long()
train_dataset = torch.utils.data.TensorDataset(X, Y)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                           sampler=train_sampler)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


model = Net()
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average,
                                     gradient_predivide_factor=args.gradient_predivide_factor)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


losses = []
for epoch in range(1, args.epochs + 1):
    model.train()
    train_sampler.set_epoch(epoch)
    total = 0.
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    losses.append(metric_average(total / len(train_loader), 'avg_loss'))
    if hvd.rank() == 0:
        print('Train Epoch: {} \tLoss: {:.6f}'.format(epoch, losses[-1]))

gathered = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())), name='gather')
expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(hvd.size())])
objs = hvd.allgather_object({'rank': hvd.rank()})
state = hvd.broadcast_object({'epoch': args.epochs, 'loss': losses[-1]}, root_rank=0)

if args.out:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    with open(os.path.join(args.out, 'rank%d.json' % hvd.rank()), 'w') as f:
        json.dump({'params': h.hexdigest(), 'first_loss': losses[0], 'final_loss': losses[-1],
                   'gather_ok': bool(torch.equal(gathered, expected)),
                   'objs': objs, 'state': state}, f)

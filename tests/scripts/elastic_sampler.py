"""Horovod's ``hvd.elastic.ElasticSampler`` in its recipe (tests/test_elastic.py):
``TorchState(model, optimizer, train_sampler=sampler)``, ``record_batch`` after each batch,
``set_epoch`` at the end of an epoch, a commit every batch.

    elastic_sampler.py OUT_DIR

Under ``bpslaunch -np 3 --min-workers 2``: rank 2 dies (``os._exit``) after its 3rd batch
of epoch 0.  The survivors restore the last commit, and the sampler splits the indices
not yet processed over the 2 ranks left.  Each rank writes OUT_DIR/rank<r>.json: the
indices it took after the reset in epoch 0, the processed count it restarted from, and
its indices of epoch 1.
"""
import json
import os
import sys

import torch

import byteps.torch as bps

out = sys.argv[1]
N, B = 60, 4
bps.init()
data = torch.utils.data.TensorDataset(torch.arange(N, dtype=torch.float32)[:, None])
sampler = bps.elastic.ElasticSampler(data, shuffle=True, seed=3)
model = torch.nn.Linear(1, 1)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                               named_parameters=model.named_parameters())
state = bps.elastic.TorchState(model, opt, train_sampler=sampler, epoch=0, batch=0)
log = {"after_reset": [], "restart_from": None, "epoch1": [], "resets": 0}


def on_reset():
    log["resets"] += 1
    log["restart_from"] = state.train_sampler.processed_num
    log["after_reset"] = []


state.register_reset_callbacks([on_reset])


@bps.elastic.run
def train(state):
    while state.epoch < 2:
        loader = torch.utils.data.DataLoader(data, batch_size=B, sampler=state.train_sampler)
        for i, (x,) in enumerate(loader):
            idx = [int(v) for v in x[:, 0]]
            if state.epoch == 0 and bps.rank() == 2 and i == 3:
                os._exit(4)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if state.epoch == 0:
                log["after_reset"] += idx
            else:
                log["epoch1"] += idx
            state.train_sampler.record_batch(i, B)
            state.commit()
        state.epoch += 1
        state.train_sampler.set_epoch(state.epoch)
        state.commit()


train(state)
with open(f"{out}/rank{bps.rank()}.json", "w") as f:
    json.dump(dict(log, size=bps.size()), f)

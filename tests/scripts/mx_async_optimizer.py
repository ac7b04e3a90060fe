"""MXNet worker script: asynchronous training (BYTEPS_ENABLE_ASYNC=1) with
``byteps.mxnet.DistributedOptimizer`` inside a plain ``gluon.Trainer(kvstore=None)``.

argv: out_dir.  Rank 0 trains 3x as many steps per epoch as rank 1
(so the workers are not in lockstep: no rank waits for the other's steps); each rank
writes rank<r>.json with its test accuracy and a digest of its final parameters (equal on
every rank after ``finish()``).
"""
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.mxnet as bps

out_dir = sys.argv[1]
bps.init()
rank, size = bps.rank(), bps.size()
digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.float32)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                    stratify=y)
x_train, y_train = x_train[rank::size], y_train[rank::size]

mx.random.seed(rank)      # different on purpose: the servers are seeded with rank 0's values
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
opt = bps.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=0.05, momentum=0.9))
trainer = gluon.Trainer(net.collect_params(), opt, kvstore=None)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
batch = 32
rng = np.random.RandomState(rank)
steps = (len(x_train) // batch) * (3 if rank == 0 else 1)
for epoch in range(6):
    for s in range(steps):
        idx = rng.randint(0, len(x_train), batch)
        data = mx.nd.array(x_train[idx])
        with autograd.record():
            loss = loss_fn(net(data), mx.nd.array(y_train[idx]))
        loss.backward()
        trainer.step(batch)
opt.finish()
pred = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
params = [p.data().asnumpy().astype(np.float64) for p in net.collect_params().values()]
res = {"rank": rank, "accuracy": float((pred == y_test).mean()), "steps": steps * 6,
       "digest": [float(p.sum()) for p in params] + [float(np.abs(p).sum()) for p in params]}
print(f"rank {rank}: test accuracy {res['accuracy']:.4f}", flush=True)
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(res, f)

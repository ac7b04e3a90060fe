"""MXNet worker script: join() with uneven data (Horovod semantics).

argv: out_dir steps,steps,...  Rank r trains STEPS[r] steps of a linear model (gluon
DistributedTrainer, then a gluon.Trainer with DistributedOptimizer), calls join() after
each, and writes rank<r>.json with the final parameters and join()'s result.
"""
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps

out_dir, steps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
bps.init()
r = bps.rank()
assert bps.size() == len(steps)
B, LR = 4, 0.1


def batch(rank, s):
    rng = np.random.RandomState(1000 * rank + s)
    return mx.nd.array(rng.randn(B, 8)), mx.nd.array(rng.randn(B, 3))


def make_net():
    net = gluon.nn.Dense(3, in_units=8)
    net.initialize(mx.init.Constant(0.25) if r else mx.init.Xavier())   # rank 0's win
    return net


res = {}
for kind in ("trainer", "optimizer"):
    mx.random.seed(0)
    net = make_net()
    if kind == "trainer":
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR})
    else:
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = gluon.Trainer(net.collect_params(), bps.DistributedOptimizer(
            mx.optimizer.create("sgd", learning_rate=LR)), kvstore=None)
    for s in range(steps[r]):
        x, y = batch(r, s)
        with autograd.record():
            loss = ((net(x) - y) ** 2).sum(axis=1)
        loss.backward()
        trainer.step(B)
    res[kind] = {"last": bps.join(),
                 "params": {k.split("_", 1)[-1]: v.data().asnumpy().tolist()
                            for k, v in net.collect_params().items()}}
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)

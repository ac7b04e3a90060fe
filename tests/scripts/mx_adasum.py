"""Worker for tests/test_mxnet_adasum.py: DistributedTrainer(algorithm=Adasum()) on 2
ranks for one step (each rank's own data; rank 1 perturbs its copy after the trainer is
built, which the first step's broadcast undoes), and allreduce(op=Adasum).  Writes
OUT_DIR/rank<r>.json: the parameters before and after the step, this rank's gradients,
the allreduce's input and result."""
import json
import sys

import mxnet as mx
import numpy as np

import byteps.mxnet as bps

bps.init()
r = bps.rank()
mx.random.seed(0)
net = mx.gluon.nn.Dense(2, in_units=3)
net.initialize(mx.init.Normal(1.0))
tr = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                            algorithm=bps.algorithms.Adasum())
net.weight.set_data(net.weight.data() + r)          # undone by the first step's broadcast
rng = np.random.default_rng(10 + r)
x, y = mx.nd.array(rng.standard_normal((4, 3))), mx.nd.array(rng.standard_normal((4, 2)))
with mx.autograd.record():
    loss = ((net(x) - y) ** 2).mean()
loss.backward()
grads = {"weight": net.weight.grad().asnumpy().tolist(), "bias": net.bias.grad().asnumpy().tolist()}
tr.step(4)
mine = rng.standard_normal(5).astype(np.float32)
res = {"grads": grads, "after": {"weight": net.weight.data().asnumpy().tolist(),
                                 "bias": net.bias.data().asnumpy().tolist()},
       "mine": mine.tolist(),
       "sum": bps.allreduce(mx.nd.array(mine), name="v", op=bps.Adasum).asnumpy().tolist()}
mx.random.seed(0)
ref = mx.gluon.nn.Dense(2, in_units=3)
ref.initialize(mx.init.Normal(1.0))                  # rank 0's start (the same seed)
ref(x)
res["start"] = {"weight": ref.weight.data().asnumpy().tolist(),
                "bias": ref.bias.data().asnumpy().tolist()}
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

"""MXNet worker script: distributed training equals one process on the combined batch.

argv: out_dir.  Each rank writes rank<r>.json with, per mode, its final parameters and
those of a plain single-process gluon.Trainer run on the concatenated batch.
"""
import json
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps

out_dir = sys.argv[1]
t_start = time.monotonic()
bps.init()
r, W = bps.rank(), bps.size()
B, STEPS, ROOT = 8, 4, 0
res = {"rank": r, "size": W}
if r == 1:
    gluon.nn.Dense(2), gluon.nn.HybridSequential()   # shift the name counters on rank 1

rng = np.random.RandomState(0)
DATA = [(rng.randn(W * B, 8).astype(np.float32), rng.randint(0, 3, W * B))
        for _ in range(STEPS)]


def make_net(seed, deferred=False, ctx=None):
    ctx = ctx or (mx.cpu(),)
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=0 if deferred else 8),
            gluon.nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier(), ctx=list(ctx))
    return net


def params_of(net):
    return [p.data().asnumpy().tolist() for p in net.collect_params().values()]


def run(net, trainer, data, batch, ctx):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in data:
        xs = gluon.utils.split_and_load(mx.nd.array(x), list(ctx))
        ys = gluon.utils.split_and_load(mx.nd.array(y), list(ctx))
        with autograd.record():
            losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(batch)


def local(data):
    return [(x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]) for x, y in data]


def mode(name, opt, opt_params, kind, deferred=False, ctx=None, compression=None,
         own=False, **hvd):
    ctx = ctx or (mx.cpu(),)
    net = make_net(100 + r, deferred, ctx)
    if kind == "trainer":
        trainer = bps.DistributedTrainer(net.collect_params(), opt, dict(opt_params),
                                         compression_params=compression, **hvd)
    else:
        bps.broadcast_parameters(net.collect_params(), root_rank=ROOT)
        dopt = bps.DistributedOptimizer(mx.optimizer.create(opt, **opt_params), **hvd)
        trainer = gluon.Trainer(net.collect_params(), dopt, kvstore=None)
    run(net, trainer, local(DATA), B, ctx)
    # own=True: this rank's own batches only; a trainer of a process set broadcasts among
    # the set only (from its first rank here, the set being this rank alone or none)
    ref = make_net(100 + (r if own and kind == "trainer" else ROOT), deferred)
    run(ref, gluon.Trainer(ref.collect_params(), opt, dict(opt_params), kvstore=None),
        local(DATA) if own else DATA, B if own else W * B, (mx.cpu(),))
    res[name] = {"dist": params_of(net), "ref": params_of(ref),
                 "names": list(net.collect_params().keys())}


SGD = {"learning_rate": 0.1, "momentum": 0.9}
ADAM = {"learning_rate": 0.01}
mode("trainer_sgd", "sgd", SGD, "trainer", deferred=True, ctx=(mx.cpu(0), mx.cpu(1)))
mode("trainer_adam", "adam", ADAM, "trainer")
mode("trainer_fp16", "sgd", SGD, "trainer", compression={"fp16": True})
mode("optimizer_sgd", "sgd", SGD, "optimizer")
mode("optimizer_adam", "adam", ADAM, "optimizer")
# Horovod's keywords: gradients divided by 4 before the sum and multiplied after (the same
# average); a process set of rank 1 alone: rank 1 averages over it (the set's path, not the
# servers'), rank 0 is outside and trains on its own gradients, so each equals one process
# on its own batches
mode("trainer_predivide", "adam", ADAM, "trainer", gradient_predivide_factor=4.0,
     prefix="hvd", num_groups=1)
LAST = bps.add_process_set([W - 1])
mode("trainer_set", "sgd", SGD, "trainer", own=True, gradient_predivide_factor=4.0,
     process_set=LAST)
mode("optimizer_set", "sgd", SGD, "optimizer", own=True, process_set=LAST)

# a checkpoint loaded on the root rank only, after the trainer was made: the first step
# broadcasts again (as in the original BytePS)
net = make_net(300 + r)
trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.0})
if r == ROOT:
    for p in net.collect_params().values():
        p.set_data(mx.nd.full(p.shape, 0.5))
run(net, trainer, local(DATA[:1]), B, (mx.cpu(),))
res["late_load"] = params_of(net)

# broadcast_parameters: a plain dict of NDArrays and a ParameterDict
for kind in ("dict", "paramdict"):
    net = make_net(200 + r)
    before = params_of(net)
    params = net.collect_params()
    if kind == "dict":
        params = {k: v.data() for k, v in params.items()}
    bps.broadcast_parameters(params, root_rank=1)
    res["bcast_" + kind] = {"before": before, "after": params_of(net)}

x = mx.nd.full((3,), r + 1.0)
bps.byteps_push_pull(x, name="pp.avg")
y = mx.nd.full((2, 2), r + 1, dtype="int32")
bps.byteps_push_pull(y, name="pp.sum", is_average=False)
res["push_pull"] = {"avg": x.asnumpy().tolist(), "sum": y.asnumpy().tolist()}
res["seconds"] = time.monotonic() - t_start
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)

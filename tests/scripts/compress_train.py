"""Worker script: train the digits MLP once per compressor (and once in float32) with
the given plugin; write each run's test accuracy and a weight digest per rank.

    compress_train.py OUT_DIR torch|numpy|tensorflow|keras|mxnet [EPOCHS]

Every tensor is compressed (the test sets BYTEPS_MIN_COMPRESS_BYTES=0).
"""
import hashlib
import json
import os
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

out_dir, plugin = sys.argv[1], sys.argv[2]
EPOCHS = int(sys.argv[3]) if len(sys.argv) > 3 else 8
CONFIGS = {
    "float32": None,
    "fp16": {"compressor": "fp16"},
    "onebit": {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"},
    "topk": {"compressor": "topk", "k": 0.1, "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": 0.5, "ef": "vanilla", "momentum": "nesterov",
                "seed": 1},
    "dithering": {"compressor": "dithering", "k": 8, "seed": 2},
    "int8": {"compressor": "int8"},
}
if os.environ.get("COMPRESS_TRAIN_ONLY"):
    CONFIGS = {k: json.loads(v) for k, v in json.loads(os.environ["COMPRESS_TRAIN_ONLY"]).items()}
LR, MOMENTUM, BATCH = 0.05, 0.9, 32

digits = load_digits()
X = (digits.data / 16.0).astype(np.float32)
x_tr, x_te, y_tr, y_te = train_test_split(X, digits.target, test_size=0.25, random_state=0,
                                          stratify=digits.target)


def batches(rank, size, epoch):
    perm = np.random.default_rng(epoch).permutation(len(x_tr))
    g = BATCH * size
    for s in range(0, len(perm) - g + 1, g):
        idx = perm[s + rank * BATCH:s + (rank + 1) * BATCH]
        yield x_tr[idx], y_tr[idx]


def init_weights():
    rng = np.random.default_rng(0)
    shapes = [(64, 128), (128,), (128, 10), (10,)]
    return [(rng.standard_normal(s) * (0.1 if len(s) == 2 else 0)).astype(np.float32)
            for s in shapes]


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, np.float32).tobytes())
    return h.hexdigest()


def run_torch(cname, params):
    import torch
    import byteps.torch as bps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt = bps.DistributedOptimizer(opt, named_parameters=[(f"{cname}.{n}", p) for n, p in
                                                          model.named_parameters()],
                                   compression_params=params)
    bps.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"P.{cname}.")
    for epoch in range(EPOCHS):
        for xb, yb in batches(bps.rank(), bps.size(), epoch):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xb)),
                                                     torch.from_numpy(yb).long())
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean())
    return acc, digest([p.detach().numpy() for p in model.parameters()])


def run_numpy(cname, params):
    import byteps.numpy as bps
    w = init_weights()
    mom = [np.zeros_like(a) for a in w]
    names = [f"{cname}.w{i}" for i in range(len(w))]
    mu = MOMENTUM
    if params and params.get("momentum"):       # the compressor does the momentum
        params, mu = dict(params, mu=MOMENTUM), 0.0
    for epoch in range(EPOCHS):
        for xb, yb in batches(bps.rank(), bps.size(), epoch):
            h = np.maximum(xb @ w[0] + w[1], 0)
            logits = h @ w[2] + w[3]
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1
            p /= len(yb)
            dh = (p @ w[2].T) * (h > 0)
            grads = [xb.T @ dh, dh.sum(0), h.T @ p, p.sum(0)]
            hs = [bps.push_pull_async(g.astype(np.float32), name=n, compression_params=params)
                  for g, n in zip(grads, names)]
            for i, hd in enumerate(hs):
                g = bps.synchronize(hd)
                mom[i] = mu * mom[i] + g
                w[i] -= LR * mom[i]
    h = np.maximum(x_te @ w[0] + w[1], 0)
    acc = float(((h @ w[2] + w[3]).argmax(1) == y_te).mean())
    return acc, digest(w)


def run_keras(cname, params, tape=False):
    import keras
    if plugin == "keras":
        import byteps.keras as bps
    else:
        import byteps.tensorflow as bps
    import tensorflow as tf
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sgd = keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)
    if plugin == "tensorflow":     # custom loop with DistributedGradientTape
        mu_moved = bool(params and params.get("momentum"))
        if mu_moved:
            params = dict(params, mu=MOMENTUM)
            sgd = keras.optimizers.SGD(learning_rate=LR, momentum=0.0)
        bps.broadcast_variables(model.variables, root_rank=0)
        for epoch in range(EPOCHS):
            for xb, yb in batches(bps.rank(), bps.size(), epoch):
                with tf.GradientTape() as t:
                    loss = loss_fn(yb, model(xb, training=True))
                t = bps.DistributedGradientTape(t, compression_params=params)
                grads = t.gradient(loss, model.trainable_variables)
                sgd.apply_gradients(zip(grads, model.trainable_variables))
    else:
        opt = bps.DistributedOptimizer(sgd, name=f"opt_{cname}", compression_params=params)
        model.compile(optimizer=opt, loss=loss_fn)
        xs = np.concatenate([xb for e in range(EPOCHS) for xb, _ in
                             batches(bps.rank(), bps.size(), e)])
        ys = np.concatenate([yb for e in range(EPOCHS) for _, yb in
                             batches(bps.rank(), bps.size(), e)])
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
    acc = float((np.argmax(model(x_te).numpy(), 1) == y_te).mean())
    return acc, digest([v.numpy() for v in model.trainable_variables])


def run_mxnet(cname, params):
    import mxnet as mx
    import byteps.mxnet as bps
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(128, activation="relu", in_units=64),
            mx.gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": LR, "momentum": MOMENTUM},
                                     compression_params=params)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(EPOCHS):
        for xb, yb in batches(bps.rank(), bps.size(), epoch):
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(xb)), mx.nd.array(yb))
            loss.backward()
            trainer.step(len(yb))
    acc = float((net(mx.nd.array(x_te)).asnumpy().argmax(1) == y_te).mean())
    return acc, digest([p.data().asnumpy() for p in net.collect_params().values()])


def main():
    mod = {"torch": "byteps.torch", "numpy": "byteps.numpy", "tensorflow": "byteps.tensorflow",
           "keras": "byteps.keras", "mxnet": "byteps.mxnet"}[plugin]
    bps = __import__(mod, fromlist=["init"])
    bps.init()
    run = {"torch": run_torch, "numpy": run_numpy, "tensorflow": run_keras,
           "keras": run_keras, "mxnet": run_mxnet}[plugin]
    res = {}
    for cname, params in CONFIGS.items():
        acc, dig = run(cname, params)
        res[cname] = {"acc": acc, "digest": dig}
        print(f"rank {bps.rank()} {plugin} {cname}: test accuracy {acc:.4f}", flush=True)
    with open(f"{out_dir}/rank{bps.rank()}.json", "w") as f:
        json.dump(res, f)
    bps.shutdown()


main()

"""Train a Gluon MLP on scikit-learn's digits with BytePS (data parallel).

    bpslaunch --standalone --num-workers 2 --num-servers 1 \\
        .venv-mxnet/bin/python examples/mxnet/train_digits_gluon.py

Each worker trains on its own shard of the training set; DistributedTrainer
broadcasts rank 0's initial parameters and averages the gradients every step.
Rank 0 prints the test accuracy of the final model.  Runs unchanged as a single
process (no bpslaunch) too.
"""
import argparse
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.mxnet as bps


def make_algorithm(name: str):
    """None (the default: SyncPS, or AsyncPS with BYTEPS_ENABLE_ASYNC=1) or a core algorithm."""
    if name == "shift_one":
        return bps.algorithms.Decentralized(peer_selection="shift_one")
    if name == "average":
        return bps.algorithms.AsyncModelAverage(sync_interval_ms=100)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--fp16", action="store_true", help="send gradients as float16")
    ap.add_argument("--algorithm", choices=("sync", "shift_one", "average"), default="sync",
                    help="SyncPS, Decentralized(shift_one) or AsyncModelAverage "
                         "(docs/algorithms.md; BYTEPS_ENABLE_ASYNC=1 gives AsyncPS)")
    args = ap.parse_args()

    bps.init()
    rank, size = bps.rank(), bps.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_train, y_train = x_train[rank::size], y_train[rank::size]       # this worker's shard

    mx.random.seed(rank)               # different on purpose: the trainer broadcasts rank 0's
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = bps.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": args.lr * size, "momentum": 0.9},
        compression_params={"fp16": True} if args.fp16 else None,
        algorithm=make_algorithm(args.algorithm))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    # the same number of steps on every rank (shards may differ by one sample)
    steps = len(x_train) // args.batch_size
    rng = np.random.RandomState(rank)
    t0 = time.monotonic()
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            data, label = mx.nd.array(x_train[idx]), mx.nd.array(y_train[idx])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)
            total += loss.mean().asscalar()
        if rank == 0:
            print(f"epoch {epoch + 1}: mean loss {total / steps:.4f}", flush=True)
    trainer.finish()                   # the algorithm's final exchange (all ranks identical)
    pred = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    acc = float((pred == y_test).mean())
    if rank == 0:
        print(f"test accuracy: {acc:.4f} ({size} worker(s), {args.epochs} epochs, "
              f"{time.monotonic() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()

"""Train a small network on scikit-learn's digits with byteps.tensorflow (no download).

    bpslaunch --standalone --num-workers 2 --num-servers 2 python examples/tensorflow/train_digits_tape.py

A custom training loop: the step is a ``tf.function`` whose GradientTape is
wrapped in ``bps.DistributedGradientTape``, so each worker trains on its
part of every global batch and the gradients are averaged through the
parameter servers while backpropagation still runs.  Prints the loss and the
test accuracy (counted over all workers' test shards) after every epoch.
"""
import argparse
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.tensorflow as bps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--fp16", action="store_true", help="compress gradients to float16")
    args = ap.parse_args()

    bps.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = bps.rank(), bps.size()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25,
                                              random_state=0, stratify=digits.target)
    x_te, y_te = x_te[rank::size], y_te[rank::size]   # every rank evaluates its shard

    tf.keras.utils.set_random_seed(rank)    # different on purpose: rank 0's weights win
    model = tf.keras.Sequential([
        tf.keras.Input((64,)), tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.Adam(args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = bps.Compression.fp16 if args.fp16 else bps.Compression.none

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bps.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # start from rank 0's weights and (empty) optimizer state
    opt.build(model.trainable_variables)
    bps.broadcast_variables(model.variables, root_rank=0)
    bps.broadcast_variables(opt.variables, root_rank=0)

    rng = np.random.default_rng(1234)       # same shuffle on every rank
    global_batch = args.batch_size * size
    t0 = time.time()
    for epoch in range(1, args.epochs + 1):
        perm = rng.permutation(len(x_tr))
        total, steps = 0.0, 0
        for start in range(0, len(perm) - global_batch + 1, global_batch):
            idx = perm[start + rank * args.batch_size:start + (rank + 1) * args.batch_size]
            loss = train_step(tf.constant(x_tr[idx]), tf.constant(y_tr[idx]))
            total, steps = total + float(loss), steps + 1
        correct = float(np.sum(np.argmax(model(x_te), axis=1) == y_te))
        stats = bps.push_pull(tf.constant([total / steps, correct, float(len(y_te))],
                                          tf.float64), op=bps.Sum, name="digits.stats")
        stats = stats.numpy()
        if rank == 0:
            print(f"epoch {epoch:2d}  loss={stats[0] / size:.4f}  "
                  f"test_acc={stats[1] / stats[2]:.4f}  ({time.time() - t0:.1f} s)", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()

"""Train a small network on scikit-learn's digits with Keras ``model.fit`` and byteps.keras.

    bpslaunch --standalone --num-workers 2 --num-servers 2 python examples/keras/train_digits_fit.py

The original BytePS/Horovod recipe: scale the learning rate by the number of
workers, wrap the optimizer in ``bps.DistributedOptimizer``, broadcast rank
0's weights when training starts, average the logged metrics over workers
and warm the learning rate up.  Each worker fits on its shard of the data.
Works with Keras 3 and, under ``TF_USE_LEGACY_KERAS=1``, with tf-keras 2.
"""
import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.keras as bps

keras = bps.keras          # Keras 3, or tf-keras when TF_USE_LEGACY_KERAS=1


class PrintEpoch(keras.callbacks.Callback):
    """Rank 0 prints the (already averaged) metrics of every epoch."""

    def on_epoch_end(self, epoch, logs=None):
        if bps.rank() == 0:
            print(f"epoch {epoch + 1:2d}  loss={logs['loss']:.4f}  "
                  f"test_acc={logs['val_accuracy']:.4f}  lr={logs.get('lr', 0):.4g}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.0025, help="per worker (scaled by size)")
    args = ap.parse_args()

    bps.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = bps.rank(), bps.size()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25,
                                              random_state=0, stratify=digits.target)
    x_tr, y_tr = x_tr[rank::size], y_tr[rank::size]      # each worker fits on its shard
    x_te, y_te = x_te[rank::size], y_te[rank::size]      # val metrics are averaged

    keras.utils.set_random_seed(rank)       # different on purpose: rank 0's weights win
    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    opt = bps.DistributedOptimizer(keras.optimizers.Adam(args.lr * size))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [
        bps.callbacks.BroadcastGlobalVariablesCallback(0),
        bps.callbacks.MetricAverageCallback(),          # before anything reading the logs
        bps.callbacks.LearningRateWarmupCallback(args.lr * size, warmup_epochs=2),
        PrintEpoch(),
    ]
    model.fit(x_tr, y_tr, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              validation_data=(x_te, y_te), callbacks=callbacks)
    bps.shutdown()


if __name__ == "__main__":
    main()

"""The original BytePS's example/tensorflow/tensorflow2_keras_mnist.py, on synthetic data.

A Sequential model built without an input shape (its variables exist only once the
first batch ran), ``bps.DistributedOptimizer``, and the example's three callbacks.
Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1.  argv: out_dir.  Each rank starts
from its own random weights and data; writes out_dir/rank<r>.json.
"""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

import byteps.tensorflow.keras as bps
from byteps._keras import optimizer_variables  # noqa: E402

out_dir = sys.argv[1]
legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
bps.init()
tf.keras.utils.set_random_seed(100 + bps.rank())        # different weights on every rank

rng = np.random.default_rng(bps.rank())
images = rng.random((256, 8, 8)).astype(np.float32)
labels = rng.integers(0, 10, 256)
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64)))
dataset = dataset.repeat().shuffle(256, seed=bps.rank()).batch(16)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(4, [3, 3], activation='relu'),
    tf.keras.layers.Conv2D(8, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(16, activation='relu'),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation='softmax')
])
assert not model.built

scaled_lr = 0.001 * bps.size()
opt = bps.DistributedOptimizer(tf.optimizers.Adam(scaled_lr))
extra = {"experimental_run_tf_function": False} if legacy else {}
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=['accuracy'], **extra)


class Record(tf.keras.callbacks.Callback):
    """After the byteps callbacks: what they left in the logs and the optimizer."""

    def __init__(self):
        super().__init__()
        self.logs, self.lrs = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in (logs or {}).items()})
        self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))


record = Record()
callbacks = [
    bps.callbacks.BroadcastGlobalVariablesCallback(0, device="GPU:0"),
    bps.callbacks.MetricAverageCallback(device="GPU:0"),
    bps.callbacks.LearningRateWarmupCallback(warmup_epochs=3, initial_lr=scaled_lr, verbose=1),
    record,
]
model.fit(dataset, steps_per_epoch=8 // bps.size(), callbacks=callbacks, epochs=4,
          verbose=1 if bps.rank() == 0 else 0)

weights = [np.asarray(w) for w in model.get_weights()]
opt_vars = optimizer_variables(model.optimizer)
digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
opt_digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in opt_vars
                                     if "iteration" not in v.name)).hexdigest()
with open(f"{out_dir}/rank{bps.rank()}.json", "w") as f:
    json.dump({"digest": digest, "opt_digest": opt_digest, "n_weights": len(weights),
               "checksum": float(sum(float(np.abs(w).sum()) for w in weights)),
               "logs": record.logs, "lrs": record.lrs,
               "iterations": int(np.asarray(model.optimizer.iterations)),
               "keras": type(model).__module__}, f)
bps.shutdown()

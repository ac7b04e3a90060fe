"""``byteps.tensorflow.distribute.MirroredStrategy`` trains as one process on every
worker's batches (tests/test_tensorflow_distribute.py).

    tf_mirrored.py OUT_DIR fit|loop DEVICES

``fit``: Keras ``model.fit`` in the strategy's scope; ``loop``: a custom loop
(``strategy.run``, ``tf.nn.compute_average_loss`` over ``num_replicas_in_sync``, Keras's
``apply_gradients``), as TensorFlow's tutorials write it.  ``DEVICES`` local replicas
(2: two logical CPUs, each worker's batch split between them).  Every rank starts from
its own random weights: the strategy gives them rank 0's.  Each rank replays the
training in one process, without byteps, on all ranks' batches (the mean gradient of
the concatenated batch) from those weights, and writes OUT_DIR/rank<r>.json: the
initial and final weights and the replay's largest difference.
"""
import json
import sys

import numpy as np
import tensorflow as tf

out, mode, ndev = sys.argv[1], sys.argv[2], int(sys.argv[3])
if ndev > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * ndev)

import keras  # noqa: E402  (after the logical devices)

import byteps.tensorflow as bps  # noqa: E402
from byteps.tensorflow.distribute import MirroredStrategy  # noqa: E402

bps.init()
rank, size = bps.rank(), bps.size()
STEPS, BATCH, LR = 4, 8 * ndev, 0.05


def data(r: int):
    rng = np.random.default_rng(10 + r)
    x = rng.normal(size=(STEPS * BATCH, 6)).astype(np.float32)
    return x, (x @ np.arange(1, 7, dtype=np.float32)[:, None] * 0.3 + r).astype(np.float32)


def build():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


devices = ["/gpu:0"] if ndev == 1 else [f"/cpu:{i}" for i in range(ndev)]
strategy = MirroredStrategy(devices=devices)
assert strategy.num_replicas_in_sync == ndev
keras.utils.set_random_seed(100 + rank)            # every rank its own initial weights
with strategy.scope():
    model = build()
    opt = keras.optimizers.SGD(LR)
    if mode == "fit":
        model.compile(loss="mse", optimizer=opt)
initial = [w.tolist() for w in model.get_weights()]
x, y = data(rank)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
if mode == "fit":
    model.fit(ds, epochs=1, shuffle=False, verbose=0)
else:
    @tf.function
    def train_step(batch):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(xb) - yb), axis=1)
                loss = tf.nn.compute_average_loss(
                    per_example, global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(fn, args=batch)
    for batch in strategy.experimental_distribute_dataset(ds):
        train_step(batch)

# the replay: one model, no strategy, the mean gradient over every rank's batch
ref = build()
ref.set_weights([np.array(w, np.float32) for w in initial])
ref_opt = keras.optimizers.SGD(LR)
both = [data(r) for r in range(size)]
for s in range(STEPS):
    xb = np.concatenate([d[0][s * BATCH:(s + 1) * BATCH] for d in both])
    yb = np.concatenate([d[1][s * BATCH:(s + 1) * BATCH] for d in both])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(ref(xb) - yb))
    ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                ref.trainable_variables))
diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), ref.get_weights()))
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"initial": initial, "final": [w.tolist() for w in model.get_weights()],
               "replay_diff": diff,
               "moved": max(float(np.abs(np.array(a) - b).max())
                            for a, b in zip(initial, model.get_weights()))}, f)
bps.shutdown()

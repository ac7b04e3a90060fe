"""Worker for tests/test_decentralized.py: TF and Keras train the digits MLP with a core
algorithm (BYTEPS_ENABLE_ASYNC=1: AsyncPS).  argv = out_dir.  Writes rank<r>.json."""
import json
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import byteps.keras as bk  # noqa: E402
import byteps.tensorflow as bps  # noqa: E402
from digits_mlp import digits  # noqa: E402

out_dir = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
x, y, xt, yt = digits()
xs, ys = x[r::n], y[r::n]
res = {"async": bps.algorithms.default().describe()}


def model(seed):
    keras.utils.set_random_seed(seed + r)          # different on every rank: init() seeds
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10)])


def digest(m):
    return float(sum(float(np.abs(w).sum()) for w in m.get_weights()))


class Record(bps.algorithms.Algorithm):
    """Local only: what init/after_step see, inside tf.function (order of the ops)."""

    def __init__(self):
        self.seen = []

    def init(self, p):
        for k in p:
            p[k] += 1000.0                    # the first update must start from here

    def after_step(self, p):
        self.seen.append(float(next(iter(p.values())).ravel()[0]))
        for k in p:
            p[k] += 100.0                     # the next update must start from here


rec = Record()
m0 = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                             kernel_initializer="zeros")])
opt0 = bk.DistributedOptimizer(keras.optimizers.SGD(1.0), name="Order", algorithm=rec)


@tf.function
def order_step():
    opt0.apply_gradients([(tf.ones((1, 1)), m0.trainable_variables[0])])


for _ in range(3):
    order_step()
res["order"] = rec.seen + [float(m0.get_weights()[0].ravel()[0])]

loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Keras: model.fit (train step in tf.function)
m = model(1)
opt = bk.DistributedOptimizer(keras.optimizers.SGD(0.2))
m.compile(optimizer=opt, loss=loss, metrics=["accuracy"])
m.fit(xs, ys, batch_size=32, epochs=12, verbose=0, shuffle=False)
opt.finish()
res["keras"] = {"acc": float(m.evaluate(xt, yt, verbose=0)[1]), "digest": digest(m)}

# TensorFlow: a custom loop, tf.function, bps.DistributedOptimizer(...).apply_gradients
m2 = model(2)
opt2 = bps.DistributedOptimizer(keras.optimizers.SGD(0.2), name="TfLoop")


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        lv = loss(yb, m2(xb, training=True))
    opt2.apply_gradients(zip(tape.gradient(lv, m2.trainable_variables),
                             m2.trainable_variables))
    return lv


for epoch in range(12):
    for i in range(0, len(xs) - 31, 32):
        step(tf.constant(xs[i:i + 32]), tf.constant(ys[i:i + 32]))
opt2.finish()
pred = np.argmax(m2(xt).numpy(), 1)
res["tf"] = {"acc": float((pred == yt).mean()), "digest": digest(m2)}
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

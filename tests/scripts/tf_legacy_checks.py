"""Worker for tests/test_tensorflow.py under TF_USE_LEGACY_KERAS=1 (tf.keras is tf-keras 2).

Checks DistributedGradientTape + broadcast_variables and model.fit with the
callbacks, with a legacy optimizer whose ``variables()`` is a method.
Usage: tf_legacy_checks.py OUT_DIR
"""
import json
import os
import sys
import traceback

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import byteps.tensorflow as bps
import byteps.tensorflow.keras as bk

keras = tf.keras
bps.init()
R, N = bps.rank(), bps.size()
OUT: dict = {"keras": keras.__name__, "bk_keras": bk.keras.__name__}
B = 8
RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, B * N, 6)).astype(np.float32)
Y = RNG.normal(size=(6, B * N, 3)).astype(np.float32)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(5, activation="tanh", input_shape=(6,)),
                             keras.layers.Dense(3)])


def loss_fn(m, x, y):
    return tf.reduce_mean(tf.square(m(x) - y))


def rel_err(a_list, b_list):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                     / max(1e-12, float(np.max(np.abs(b))))) for a, b in zip(a_list, b_list))


def reference(seed):
    ref = make_model(seed)
    for s in range(3):
        with tf.GradientTape() as tape:
            loss = loss_fn(ref, X[s], Y[s])
        for v, g in zip(ref.trainable_variables, tape.gradient(loss, ref.trainable_variables)):
            v.assign_sub(0.1 * g)
    return ref.get_weights()


def tape_and_broadcast():
    m = make_model(10 + R)                       # different start on every rank
    opt = keras.optimizers.legacy.SGD(0.1)
    bps.broadcast_variables(m.variables, root_rank=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(m, x, y)
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))
    for s in range(3):
        step(tf.constant(X[s][R * B:(R + 1) * B]), tf.constant(Y[s][R * B:(R + 1) * B]))
        if s == 0:                               # optimizer state exists after step 1
            bps.broadcast_variables(opt.variables(), root_rank=0)
    return {"rel": rel_err(m.get_weights(), reference(10)),
            "w": [w.tolist() for w in m.get_weights()],
            "opt_vars_is_method": callable(opt.variables)}


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in (logs or {}).items()})


def fit():
    m = make_model(200 + R)
    opt = bk.DistributedOptimizer(keras.optimizers.legacy.SGD(0.05, momentum=0.5))
    m.compile(optimizer=opt, loss="mse", metrics=["mae"])
    pre, post, last = Record(), Record(), Record()
    m.fit(X.reshape(-1, 6)[:48][R::N], Y.reshape(-1, 3)[:48][R::N], batch_size=8, epochs=2,
          shuffle=False, verbose=0,
          callbacks=[pre, bk.callbacks.BroadcastGlobalVariablesCallback(0),
                     bk.callbacks.MetricAverageCallback(), post,
                     bk.callbacks.LearningRateWarmupCallback(0.05, warmup_epochs=2), last])
    return {"w": [w.tolist() for w in m.get_weights()], "pre": pre.logs, "post": post.logs,
            "lrs": [e["lr"] for e in last.logs],
            "opt_class": type(opt).__name__, "iterations": int(opt.iterations.numpy()),
            "momentum": float(opt.momentum.numpy()), "lr": float(opt.learning_rate.numpy()),
            "slots": [w.tolist() for w in opt.get_weights()[1:]]}


for name, fn in [("tape", tape_and_broadcast), ("fit", fit)]:
    try:
        OUT[name] = fn()
    except Exception:   # noqa: BLE001 - recorded: the test shows which check failed where
        OUT[name] = {"error": traceback.format_exc()}
with open(os.path.join(sys.argv[1], f"rank{R}.json"), "w") as f:
    json.dump(OUT, f)
print(f"rank {R}: done")

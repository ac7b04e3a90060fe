"""Worker for tests/test_compose_tf.py.  argv = out_dir, part.

part "async": DistributedGradientTape under BYTEPS_ENABLE_ASYNC=1 (AsyncPS) trains the
digits MLP with rank 1 slowed (sleep per step): each rank's loop time, the loss before and
after, accuracy and a weight digest after ``bps.finish()``; then the same inside
``tf.function``.
part "qadam": bps.QAdamOptimizer through DistributedOptimizer (model.fit) and through
DistributedGradientTape(optimizer=...) -- under TF_USE_LEGACY_KERAS=1 that is tf-keras 2.
part "lr": lr-aware error feedback: onebit + error feedback, the optimizer's learning rate
reaches every compression pipeline of the exchanged gradients (Keras optimizer and tape).
Writes rank<r>.json.
"""
import hashlib
import json
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import byteps.tensorflow as bps  # noqa: E402
from byteps import _keras  # noqa: E402
from digits_mlp import digits  # noqa: E402

keras = _keras.default_keras()
out_dir, part = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
x, y, xt, yt = digits()
xs, ys = x[r::n], y[r::n]
res: dict = {"keras": keras.__name__}
lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def model(seed, hidden=32):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10)])


def digest(m):
    return hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes()
                                   for v in m.trainable_variables)).hexdigest()


def accuracy(m):
    return float((np.argmax(m(xt).numpy(), 1) == yt).mean())


def full_loss(m):
    return float(lossf(y, m(x)))


if part == "async":
    EPOCHS, SLEEP = 3, 0.1
    m = model(10 + r)                        # different on every rank: AsyncPS seeds rank 0's
    opt = keras.optimizers.SGD(0.2)
    res["loss0"] = full_loss(m)
    t0 = time.perf_counter()
    for epoch in range(EPOCHS):
        for i in range(0, len(xs) - 31, 32):
            with tf.GradientTape() as tape:
                lv = lossf(ys[i:i + 32], m(xs[i:i + 32], training=True))
            tape = bps.DistributedGradientTape(tape)
            grads = tape.gradient(lv, m.trainable_variables)
            opt.apply_gradients(zip(grads, m.trainable_variables))
            if r == 1:
                time.sleep(SLEEP)            # the straggler
    res["loop_s"] = time.perf_counter() - t0
    res["steps"] = EPOCHS * len(range(0, len(xs) - 31, 32))
    res["sleep"] = SLEEP
    tape.finish()                            # = bps.finish(): the last update, final pull
    res["eager"] = {"loss": full_loss(m), "acc": accuracy(m), "digest": digest(m)}

    m2 = model(20 + r)
    opt2 = keras.optimizers.SGD(0.2)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            lv = lossf(yb, m2(xb, training=True))
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(lv, m2.trainable_variables)
        opt2.apply_gradients(zip(grads, m2.trainable_variables))
        return lv

    loss0 = full_loss(m2)
    for epoch in range(4):
        for i in range(0, len(xs) - 31, 32):
            step(tf.constant(xs[i:i + 32]), tf.constant(ys[i:i + 32]))
    bps.finish()
    res["function"] = {"loss0": loss0, "loss": full_loss(m2), "acc": accuracy(m2),
                       "digest": digest(m2)}

elif part == "qadam":
    # model.fit with DistributedOptimizer(QAdamOptimizer)
    m = model(1, 64)
    opt = bps.DistributedOptimizer(bps.QAdamOptimizer(learning_rate=0.005, warmup_steps=10),
                                   name="fitQAdam")
    m.compile(optimizer=opt, loss=lossf)
    import byteps.tensorflow.keras as bk
    m.fit(xs, ys, batch_size=32, epochs=4, shuffle=False, verbose=0,
          callbacks=[bk.callbacks.BroadcastGlobalVariablesCallback(0)])
    res["fit"] = {"acc": accuracy(m), "digest": digest(m),
                  "iterations": int(opt.iterations), "class": type(opt).__name__}
    # a custom loop: DistributedGradientTape(optimizer=QAdam), eager then tf.function
    for mode in ("eager", "function"):
        m2 = model(2, 64)
        q = bps.QAdamOptimizer(learning_rate=0.005, warmup_steps=10)

        def step(xb, yb, m2=m2, q=q, mode=mode):
            with tf.GradientTape() as tape:
                lv = lossf(yb, m2(xb, training=True))
            tape = bps.DistributedGradientTape(tape, optimizer=q)
            grads = tape.gradient(lv, m2.trainable_variables)
            q.apply_gradients(zip(grads, m2.trainable_variables))
            return lv
        fn = tf.function(step) if mode == "function" else step
        for epoch in range(4):
            for i in range(0, len(xs) - 31, 32):
                fn(tf.constant(xs[i:i + 32]), tf.constant(ys[i:i + 32]))
        res["tape_" + mode] = {"acc": accuracy(m2), "digest": digest(m2),
                               "iterations": int(q.iterations)}
    _, _, table = bps.get_pushpull_speed(per_tensor=True)
    res["momentum_names"] = sorted(k for k in table if "QAdam.exp_avg." in k)

elif part == "lr":
    from byteps.core import api as core
    params = {"compressor": "onebit", "ef": "vanilla"}

    def pipes_lr(prefix):
        """The learning rate every compression pipeline of ``prefix``'s tensors holds."""
        st = core._state()
        lrs = {p._lr for name, t in st.tensors.items() if str(name).startswith(prefix)
               for p in t.pipes.values()}
        return sorted(lrs)

    w = tf.Variable(tf.ones((256, 8)))
    seen = {}
    for label, lrs in (("keras", (0.5, 0.25, 0.125)), ("tape", (0.4, 0.2, 0.1))):
        inner = keras.optimizers.SGD(lrs[0])
        opt = bps.DistributedOptimizer(inner, compression_params=params, name=f"Lr{label}") \
            if label == "keras" else inner
        got = []
        for k, lr in enumerate(lrs):
            opt.learning_rate.assign(lr) if hasattr(opt.learning_rate, "assign") else \
                setattr(opt, "learning_rate", lr)
            with tf.GradientTape() as tape:
                lv = tf.reduce_sum(w * tf.constant(np.random.default_rng(k + r).normal(
                    size=(256, 8)).astype(np.float32)))
            if label == "keras":
                opt.apply_gradients([(tape.gradient(lv, w), w)])
                got.append(pipes_lr(f"Lr{label}"))
            else:
                tape = bps.DistributedGradientTape(tape, compression_params=params,
                                                   optimizer=opt)
                opt.apply_gradients([(tape.gradient(lv, w), w)])
                got.append(pipes_lr("DistributedGradientTape"))
        seen[label] = got
    res["pipes_lr"] = seen
    # tf.function: the learning rate of each call reaches the core inside the graph
    w3 = tf.Variable(tf.ones((256, 8)))
    opt3 = bps.DistributedOptimizer(keras.optimizers.SGD(0.3), compression_params=params,
                                    name="LrFn")

    @tf.function
    def fstep():
        with tf.GradientTape() as tape:
            lv = tf.reduce_sum(w3 * w3)
        opt3.apply_gradients([(tape.gradient(lv, w3), w3)])

    fn_seen = []
    for lr in (0.3, 0.03):
        opt3.learning_rate.assign(lr)
        fstep()
        fn_seen.append(pipes_lr("LrFn"))
    res["function_lr"] = fn_seen

with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

"""Worker for tests/test_tensorflow.py: many TF/Keras 3 checks in one job (TF starts slowly).

Writes <out_dir>/rank<r>.json; the test compares ranks and references.
Usage: tf_checks.py OUT_DIR
"""
import json
import os
import sys
import traceback

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras

import byteps.keras as bk
import byteps.tensorflow as bps

bps.init()
R, N = bps.rank(), bps.size()
OUT: dict = {"rank": R, "size": N}
B = 8                       # rows per rank per step
RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, B * N, 6)).astype(np.float32)      # 6 steps of data
Y = RNG.normal(size=(6, B * N, 3)).astype(np.float32)


def shard(a):
    return a[..., R * B:(R + 1) * B, :]


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(3)])


def loss_fn(m, x, y):
    return tf.reduce_mean(tf.square(m(x) - y))


def weights(m):
    return [w.tolist() for w in m.get_weights()]


def rel_err(a_list, b_list):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                     / max(1e-12, float(np.max(np.abs(b))))) for a, b in zip(a_list, b_list))


def reference(steps=3, lr=0.1):
    m = make_model(1)
    for s in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(m, X[s], Y[s])
        for v, g in zip(m.trainable_variables, tape.gradient(loss, m.trainable_variables)):
            v.assign_sub(lr * g)
    return m.get_weights()


def check(name, fn):
    try:
        OUT[name] = fn()
    except Exception:   # noqa: BLE001 - recorded: the test shows which check failed where
        OUT[name] = {"error": traceback.format_exc()}


# ---------------------------------------------------------------- DistributedGradientTape
def tape_step(m, x, y, lr=0.1):
    with tf.GradientTape() as tape:
        loss = loss_fn(m, x, y)
    tape = bps.DistributedGradientTape(tape)
    for v, g in zip(m.trainable_variables, tape.gradient(loss, m.trainable_variables)):
        v.assign_sub(lr * g)


def tape_eager():
    m = make_model(1)
    for s in range(3):
        tape_step(m, shard(X[s]), shard(Y[s]))
    return {"rel": rel_err(m.get_weights(), reference()), "w": weights(m)}


def tape_function():
    m = make_model(1)
    step = tf.function(lambda x, y: tape_step(m, x, y))
    for s in range(3):
        step(tf.constant(shard(X[s])), tf.constant(shard(Y[s])))
    return {"rel": rel_err(m.get_weights(), reference()), "w": weights(m)}


# ---------------------------------------------------------------- push_pull / broadcast
def push_pulls():
    x = tf.fill([3], float(R + 1))
    f = tf.function(lambda t: (bps.push_pull(t, op=bps.Sum), bps.push_pull(t)))
    s_fn, a_fn = f(x)
    i = bps.push_pull(tf.constant([R + 1, 7], tf.int32))         # int average floors
    sp = bps.push_pull(tf.IndexedSlices(tf.fill([R + 1, 2], float(R + 1)),
                                        tf.constant([R] * (R + 1), tf.int64),
                                        tf.constant([5, 2], tf.int64)), op=bps.Sum)
    fp16 = bps.push_pull(tf.constant([1.5, -2.25], tf.float32) * (R + 1),
                         compression=bps.Compression.fp16)
    bsum = bps.push_pull(tf.constant(float(R)), op=bps.Sum)       # a scalar
    return {"sum": bps.push_pull(x, op=bps.Sum).numpy().tolist(),
            "avg": bps.push_pull(x, average=True).numpy().tolist(),
            "sum_fn": s_fn.numpy().tolist(), "avg_fn": a_fn.numpy().tolist(),
            "int_avg": i.numpy().tolist(), "scalar_sum": float(bsum), "scalar_shape":
            list(bsum.shape), "sparse_values": sp.values.numpy().tolist(),
            "sparse_indices": sp.indices.numpy().tolist(), "fp16": fp16.numpy().tolist(),
            "fp16_dtype": fp16.dtype.name,
            "bcast": bps.broadcast(tf.constant([R, R + 10]), root_rank=1).numpy().tolist()}


def broadcast_vars():
    m = make_model(100 + R)
    flag = tf.Variable(R == 0)                    # bool: carried as uint8
    bps.broadcast_variables(m.variables + [flag], root_rank=1)
    want = make_model(101).get_weights()
    m2 = make_model(300 + R)

    @tf.function
    def bcast():
        bps.broadcast_variables(m2.variables, root_rank=0)
    bcast()
    return {"rel": rel_err(m.get_weights(), want), "flag": bool(flag.numpy()),
            "w_fn": weights(m2)}


# ---------------------------------------------------------------- embeddings
def emb_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])


IDS = RNG.integers(0, 20, size=(3, B * N, 3)).astype(np.int32)
T = RNG.normal(size=(3, B * N, 1)).astype(np.float32)


def emb_run(sparse_as_dense, distributed, function):
    m = emb_model(5)
    kinds = []

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(m, x, y)
        if distributed:
            tape = bps.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        grads = tape.gradient(loss, m.trainable_variables)
        kinds.append(type(grads[0]).__name__)
        for v, g in zip(m.trainable_variables, grads):
            v.assign_sub(0.5 * tf.convert_to_tensor(g))
    run = tf.function(step) if function else step
    for s in range(3):
        x, y = (shard(IDS[s]), shard(T[s])) if distributed else (IDS[s], T[s])
        run(tf.constant(x), tf.constant(y))
    return m.get_weights(), kinds[0]


def embeddings():
    ref, ref_kind = emb_run(False, False, False)
    sparse_w, sparse_kind = emb_run(False, True, True)
    dense_w, dense_kind = emb_run(True, True, False)
    sparse_eager_w, _ = emb_run(False, True, False)
    return {"ref_kind": ref_kind, "sparse_kind": sparse_kind, "dense_kind": dense_kind,
            "rel_sparse": rel_err(sparse_w, ref), "rel_dense": rel_err(dense_w, ref),
            "rel_sparse_eager": rel_err(sparse_eager_w, ref),
            "moved": max(float(np.max(np.abs(a - b)))
                         for a, b in zip(ref, emb_model(5).get_weights()))}


# ---------------------------------------------------------------- Keras 3 optimizer + fit
class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in (logs or {}).items()})


def keras_fit():
    m = make_model(200 + R)                      # different on every rank
    opt = bk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5))
    m.compile(optimizer=opt, loss="mse", metrics=["mae"])
    pre, post, last = Record(), Record(), Record()
    m.fit(X.reshape(-1, 6)[:48][R::N], Y.reshape(-1, 3)[:48][R::N], batch_size=8, epochs=2,
          shuffle=False, verbose=0,
          callbacks=[pre, bk.callbacks.BroadcastGlobalVariablesCallback(0),
                     bk.callbacks.MetricAverageCallback(), post,
                     bk.callbacks.LearningRateWarmupCallback(0.05, warmup_epochs=2), last])
    return {"w": weights(m), "pre": pre.logs, "post": post.logs,
            "lrs": [e["lr"] for e in last.logs],
            "opt_class": type(opt).__name__, "is_sgd": isinstance(opt, keras.optimizers.SGD),
            "iterations": int(opt.iterations.numpy()), "lr": float(opt.learning_rate.numpy())}


def keras_apply_and_passes():
    """apply_gradients (1 pass) and backward_passes_per_step=2 against references."""
    m = make_model(1)
    opt = bk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    for s in range(3):
        with tf.GradientTape() as tape:
            loss = loss_fn(m, shard(X[s]), shard(Y[s]))
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables),
                                m.trainable_variables))
    one = rel_err(m.get_weights(), reference())
    m2 = make_model(1)
    opt2 = bk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(m2, x, y)
        opt2.apply(tape.gradient(loss, m2.trainable_variables), m2.trainable_variables)
    for s in range(4):
        step(tf.constant(shard(X[s])), tf.constant(shard(Y[s])))
    ref = make_model(1)                          # 2 updates on 2 micro-batches each
    for k in range(2):
        with tf.GradientTape() as tape:
            loss = loss_fn(ref, np.concatenate([X[2 * k], X[2 * k + 1]]),
                           np.concatenate([Y[2 * k], Y[2 * k + 1]]))
        for v, g in zip(ref.trainable_variables, tape.gradient(loss, ref.trainable_variables)):
            v.assign_sub(0.1 * g)
    return {"rel_one": one, "rel_passes": rel_err(m2.get_weights(), ref.get_weights()),
            "iterations": int(opt2.iterations.numpy())}


# ---------------------------------------------------------------- bad input
def keras_local_vars():
    """Horovod's PartialDistributedOptimizer (register_local_var) and compute_gradients: the
    first layer's gradients stay on their rank divided by N, the others are averaged, and
    apply_gradients does not average the computed gradients again."""
    m = make_model(1)                            # identical on every rank
    opt = bk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=m.layers[0])
    x = tf.ones((1, 6))

    def loss():
        return (R + 1.0) * tf.reduce_sum(m(x))     # rank r's gradient: (r + 1) g
    gv = opt.compute_gradients(loss, m.trainable_variables)
    with tf.GradientTape() as tape:
        raw = tape.gradient(loss(), m.trainable_variables)
    mean = sum(range(1, N + 1)) / N
    got = [g.numpy() for g, _ in gv]
    before = m.get_weights()
    opt.apply_gradients(gv)
    return {"local": rel_err(got[:2], [r.numpy() / N for r in raw[:2]]),
            "shared": rel_err(got[2:], [r.numpy() * mean / (R + 1) for r in raw[2:]]),
            "applied": rel_err(m.get_weights(), [w - g for w, g in zip(before, got)])}


def mismatch():
    out = {}
    v = tf.Variable(tf.ones([3 + R]), name="mismatched")      # same name, other shape
    for mode in ("eager", "function"):
        w = v if mode == "eager" else tf.Variable(tf.ones([3 + R]), name="mismatched_fn")

        def step(w=w):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * w)
            return bps.DistributedGradientTape(tape).gradient(loss, [w])
        try:
            (tf.function(step) if mode == "function" else step)()
            out[mode] = "no error"
        except Exception as exc:   # noqa: BLE001 - the core's error, whatever TF wraps it in
            out[mode] = f"{type(exc).__name__}: {exc}"
    return out


# ---------------------------------------------------------------- tf.compat.v1, load_model, errors
def v1_optimizer():
    """tf.compat.v1.train optimizers take plain tf.Variables (not Keras 3 variables)."""
    w0 = np.random.default_rng(3).normal(size=(6, 3)).astype(np.float32)

    def run(distributed):
        w, b = tf.Variable(w0, name="v1_w"), tf.Variable(tf.zeros([3]), name="v1_b")
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        if distributed:
            opt = bps.DistributedOptimizer(opt)
        for s in range(3):
            x, y = (shard(X[s]), shard(Y[s])) if distributed else (X[s], Y[s])
            opt.minimize(lambda x=x, y=y: tf.reduce_mean(tf.square(x @ w + b - y)),
                         var_list=[w, b])
        return [w.numpy(), b.numpy()]
    return {"rel": rel_err(run(True), run(False))}


def load_model():
    m = make_model(1)
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    m.fit(X[0], Y[0], epochs=1, verbose=0)          # same on every rank (not distributed)
    path = os.path.join(sys.argv[1], f"model{R}.keras")
    m.save(path)
    m2 = bk.load_model(path)
    slots_kept = rel_err([v.numpy() for v in m2.optimizer.variables],
                         [v.numpy() for v in m.optimizer.variables])
    m2.fit(shard(X[1]), shard(Y[1]), epochs=1, verbose=0)     # now averaged across ranks
    return {"class": type(m2.optimizer).__name__, "slots_rel": slots_kept,
            "distributed": hasattr(m2.optimizer, "_bps"),
            "is_adam": isinstance(m2.optimizer, keras.optimizers.Adam),
            "w": weights(m2)}


def api_errors():
    out = {}
    cases = {
        "op_and_average": lambda: bps.push_pull(tf.ones(2), average=True, op=bps.Sum),
        "bad_op": lambda: bps.push_pull(tf.ones(2), op="Median"),
        "double_wrap": lambda: bk.DistributedOptimizer(
            bk.DistributedOptimizer(keras.optimizers.SGD())),
        "v1_passes": lambda: bps.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2),
        "bad_root": lambda: bps.broadcast(tf.ones(2), root_rank=N),
        "bad_dtype": lambda: bps.push_pull(tf.constant([1 + 2j])),   # bool is carried
        "global_vars_eager": lambda: bps.broadcast_global_variables(0),
        "not_optimizer": lambda: bps.DistributedOptimizer(object()),
    }
    for k, fn in cases.items():
        try:
            fn()
            out[k] = "no error"
        except Exception as exc:   # noqa: BLE001 - every error message is checked
            out[k] = f"{type(exc).__name__}: {exc}"
    return out


for name, fn in [("tape_eager", tape_eager), ("tape_function", tape_function),
                 ("push_pulls", push_pulls), ("broadcast_vars", broadcast_vars),
                 ("embeddings", embeddings), ("keras_fit", keras_fit),
                 ("keras_apply", keras_apply_and_passes), ("v1", v1_optimizer),
                 ("load_model", load_model), ("api_errors", api_errors),
                 ("mismatch", mismatch), ("keras_local_vars", keras_local_vars)]:
    check(name, fn)
with open(os.path.join(sys.argv[1], f"rank{R}.json"), "w") as f:
    json.dump(OUT, f)
print(f"rank {R}: done")

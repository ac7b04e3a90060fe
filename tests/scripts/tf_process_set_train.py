"""Worker for tests/test_tensorflow_distribute.py: Horovod's ``process_set=`` on the
TensorFlow gradient wrappers, on 3 workers with the set [0, 2] registered by
``init(process_sets=[...])``.  argv = out_dir mode compressor; mode: ``tape``
(DistributedGradientTape) or ``keras`` (DistributedOptimizer under model.fit);
compressor: ``none`` or a byteps compressor name.  Each rank trains linear regression on
its own data for 6 full-batch SGD steps from zero weights and writes OUT/rank<r>.json with
its final weights and the one-process replay: ranks 0 and 2 step on the mean of their
two gradients, rank 1 (outside the set) on its own."""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import byteps.tensorflow as bps

out, mode, comp = sys.argv[1], sys.argv[2], sys.argv[3]
MEMBERS, STEPS, LR, N, D = [0, 2], 6, 0.1, 32, 4
ps = bps.ProcessSet(MEMBERS)
bps.init(process_sets=[ps])
r = bps.rank()
assert bps.size() == 3 and ps.process_set_id == 1 and ps.included() == (r in MEMBERS)
params = None if comp == "none" else {"compressor": comp, "ef": "vanilla"}


def data(rank):
    g = np.random.default_rng(100 + rank)
    x = g.normal(size=(N, D)).astype(np.float32)
    return x, (x @ np.arange(1, D + 1, dtype=np.float32) + rank).astype(np.float32)


def replay(rank):
    w = np.zeros(D, np.float64)
    group = MEMBERS if rank in MEMBERS else [rank]
    for _ in range(STEPS):
        gs = []
        for q in group:
            x, y = data(q)
            gs.append(2.0 / N * x.T @ (x @ w - y))
        w = w - LR * np.mean(gs, axis=0)
    return w


x, y = data(r)
if mode == "tape":
    w = tf.Variable(tf.zeros(D))
    opt = tf.keras.optimizers.SGD(LR)
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(x, w) - y) ** 2)
        dtape = bps.DistributedGradientTape(tape, process_set=ps, compression_params=params)
        opt.apply_gradients(zip(dtape.gradient(loss, [w]), [w]))
    final = w.numpy()
else:
    model = tf.keras.Sequential([tf.keras.Input((D,)),
                                 tf.keras.layers.Dense(1, use_bias=False,
                                                       kernel_initializer="zeros")])
    opt = bps.DistributedOptimizer(tf.keras.optimizers.SGD(LR), process_set=ps,
                                   compression_params=params)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y[:, None], batch_size=N, epochs=STEPS, shuffle=False, verbose=0)
    final = model.get_weights()[0][:, 0]
with open(os.path.join(out, f"rank{r}.json"), "w") as f:
    json.dump({"final": [float(v) for v in final], "replay": list(replay(r))}, f)
bps.shutdown()

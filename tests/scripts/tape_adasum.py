"""Worker for tests/test_adasum.py: DistributedGradientTape(op=hvd.Adasum) with SGD for two
eager steps on each rank's own batches (Horovod's tape: the gradients combined with
Adasum).  Writes OUT_DIR/rank<r>.json: the weights before each step, this rank's local
gradients there, and the final weights."""
import json
import sys

import numpy as np
import tensorflow as tf

import byteps.tensorflow as hvd

hvd.init()
r = hvd.rank()
w = tf.Variable(np.arange(6.0, dtype="float32").reshape(3, 2))
opt = tf.keras.optimizers.SGD(0.5)
rng = np.random.default_rng(10 + r)
before, local = [], []
for step in range(2):
    x = tf.constant(rng.standard_normal((4, 3)).astype("float32"))
    with tf.GradientTape() as plain:
        loss = tf.reduce_mean(tf.square(x @ w))
    local.append(plain.gradient(loss, w).numpy().tolist())
    before.append(w.numpy().tolist())
    with hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum) as tape:
        loss = tf.reduce_mean(tf.square(x @ w))
    (g,) = tape.gradient(loss, [w])
    opt.apply_gradients([(g, w)])
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump({"before": before, "local": local, "after": w.numpy().tolist()}, f)
hvd.shutdown()

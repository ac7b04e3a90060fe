"""Worker for tests/test_adasum.py (argv: OUT_DIR keras|tensorflow): a Keras model compiled
with byteps.tensorflow.keras's or byteps.tensorflow's DistributedOptimizer(SGD(0.5),
op=hvd.Adasum), one step of model.fit on each rank's own
batch (the broadcast callback syncs the start).  Writes OUT_DIR/rank<r>.json: the start,
this rank's gradients at the start, and the weights after the step."""
import json
import sys

import numpy as np
import tensorflow as tf

import byteps.tensorflow as tfhvd
import byteps.tensorflow.keras as hvd

plugin = hvd if sys.argv[2] == "keras" else tfhvd      # both plugins' DistributedOptimizer

hvd.init()
r = hvd.rank()
tf.keras.utils.set_random_seed(r)                 # rank-dependent init: the callback syncs
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
model.compile(plugin.DistributedOptimizer(tf.keras.optimizers.SGD(0.5), op=plugin.Adasum),
              "mse")
rng = np.random.default_rng(10 + r)
x = rng.standard_normal((4, 3)).astype("float32")
y = rng.standard_normal((4, 2)).astype("float32")
start = [hvd.broadcast(v, 0, name=f"start.{i}").numpy() for i, v in enumerate(model.weights)]
for v, s in zip(model.weights, start):
    v.assign(s)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
grads = [g.numpy().tolist() for g in tape.gradient(loss, model.trainable_variables)]
model.fit(x, y, batch_size=4, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump({"start": [s.tolist() for s in start], "grads": grads,
               "after": [v.numpy().tolist() for v in model.trainable_variables]}, f)
hvd.shutdown()

"""Keras's loss scaling (``keras.mixed_precision.LossScaleOptimizer``, Keras 3) and
``byteps.tensorflow.keras.DistributedOptimizer``, trained with ``model.fit``: rank 1's
batch 2 of each epoch overflows (one input of 3e37), so its scaled gradients are inf
(tests/test_compression.py).

    keras_loss_scaling.py OUT_DIR none|onebit|outer|policy|policy_qadam

none, onebit: Horovod's order, the scaler inside ``DistributedOptimizer``; the sum of the
gradients is then NaN on every rank (with onebit + error feedback: wire.NONFINITE), so
every rank's LossScaleOptimizer skips the step and halves its scale.  outer: the other
order, ``LossScaleOptimizer(DistributedOptimizer(Adam))``, in float32.  policy,
policy_qadam: the ``mixed_float16`` policy, under which ``model.compile`` wraps the
DistributedOptimizer (of Adam, or of QAdamOptimizer with 2 warm-up steps) in a
LossScaleOptimizer; byteps makes that scaler's overflow check the job's.
Writes OUT_DIR/rank<r>.json: the scale, the optimizer's step count, whether every weight
is finite, and a digest of the weights.
"""
import hashlib
import json
import sys

import keras
import numpy as np

import byteps.tensorflow.keras as bps

out, comp = sys.argv[1], sys.argv[2]
bps.init()
r = bps.rank()
rng = np.random.default_rng(r)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x.sum(1, keepdims=True) > 0).astype("float32")
if r == 1:
    x[40] = 3e37              # batch 2 of 4 (16 rows each): the loss scale overflows
keras.utils.set_random_seed(1)
if comp.startswith("policy"):
    keras.mixed_precision.set_global_policy("mixed_float16")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, dtype="float32")])
extra = {"compression_params": {"compressor": "onebit", "ef": "vanilla"}} \
    if comp == "onebit" else {}
if comp.startswith("policy"):
    inner = bps.QAdamOptimizer(learning_rate=0.01, warmup_steps=2) \
        if comp == "policy_qadam" else keras.optimizers.Adam(0.01)
    model.compile(loss="mse", optimizer=bps.DistributedOptimizer(inner))
    opt = model.optimizer
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer), type(opt)
    assert opt.initial_scale == 2.0 ** 15
elif comp == "outer":       # the scaler outside, float32: the same steps as Horovod's order
    opt = keras.mixed_precision.LossScaleOptimizer(
        bps.DistributedOptimizer(keras.optimizers.Adam(0.01)), initial_scale=2.0 ** 15)
    model.compile(loss="mse", optimizer=opt)
else:
    opt = bps.DistributedOptimizer(keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=2.0 ** 15), **extra)
    model.compile(loss="mse", optimizer=opt)
model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
          callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
weights = model.get_weights()
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump({"scale": float(np.asarray(opt.dynamic_scale)),
               "steps": int(np.asarray(opt.inner_optimizer.iterations
                                        if comp in ("policy", "policy_qadam", "outer")
                                        else opt.iterations)),
               "finite": bool(all(np.isfinite(w).all() for w in weights)),
               "digest": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()[:16]},
              f)
bps.shutdown()

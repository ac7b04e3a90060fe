"""Worker script: digits with Keras 3 model.fit, DistributedOptimizer(Adam) vs
DistributedOptimizer(bps.QAdamOptimizer); accuracy, weight digest, momentum bytes."""
import hashlib
import json
import sys

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.keras as bps

out_dir = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
d = load_digits()
x_tr, x_te, y_tr, y_te = train_test_split((d.data / 16).astype(np.float32), d.target,
                                          test_size=0.25, random_state=0, stratify=d.target)
x_tr, y_tr = x_tr[r::n], y_tr[r::n]


def train(kind):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    inner = keras.optimizers.Adam(0.003) if kind == "adam" else \
        bps.QAdamOptimizer(learning_rate=0.003, warmup_steps=20)
    model.compile(optimizer=bps.DistributedOptimizer(inner, name=f"opt_{kind}"),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_tr, y_tr, batch_size=32, epochs=8, shuffle=False, verbose=0,
              callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
    acc = float((np.argmax(model(x_te).numpy(), 1) == y_te).mean())
    h = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables))
    return acc, h.hexdigest()


res = {k: train(k) for k in ("adam", "qadam")}
_, _, table = bps.get_pushpull_speed(per_tensor=True) if hasattr(bps, "get_pushpull_speed") \
    else (0, 0, {})
mom = [v for k, v in table.items() if "QAdam.exp_avg." in k and "kernel" in k]
# the largest momentum (64x256 kernel); the 256x10 one is under BYTEPS_MIN_COMPRESS_BYTES
res["momentum_bytes"] = max(mom, key=lambda b: b["pushed"]) if mom else None
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

"""Horovod's elastic Keras recipe (its examples' tensorflow2_keras_mnist_elastic.py):
``model.fit`` inside ``bps.elastic.run`` with ``CommitStateCallback``,
``UpdateBatchStateCallback`` and ``UpdateEpochStateCallback`` (tests/test_elastic.py).

    keras_elastic_callbacks.py OUT_DIR

Under ``bpslaunch -np 2 --min-workers 1``: rank 1 dies (``os._exit``) at batch 3 of epoch
1; rank 0 restores the last commit and goes on alone.  Writes OUT_DIR/rank<r>.json with
the epochs trained after the reset, ``state.epoch``/``state.batch`` at the end and the
loss.
"""
import json
import os
import sys

import keras
import numpy as np

import byteps.keras as bps

out = sys.argv[1]
EPOCHS, STEPS = 4, 6
bps.init()
rng = np.random.default_rng(bps.rank())
x = rng.normal(size=(STEPS * 8, 5)).astype("float32")
y = (x @ np.arange(1, 6, dtype=np.float32)[:, None]).astype("float32")
keras.utils.set_random_seed(7)
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
model.compile(loss="mse", optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.02)))
state = bps.elastic.KerasState(model, batch=0, epoch=0)
fits = []


class Die(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if bps.rank() == 1 and state.epoch == 1 and batch == 3:
            os._exit(5)


@bps.elastic.run
def train(state):
    fits.append(state.epoch)
    hist = state.model.fit(x, y, batch_size=8, epochs=EPOCHS - state.epoch, verbose=0,
                           shuffle=False, callbacks=[
                               bps.callbacks.BroadcastGlobalVariablesCallback(0),
                               bps.elastic.UpdateEpochStateCallback(state),
                               bps.elastic.UpdateBatchStateCallback(state),
                               bps.elastic.CommitStateCallback(state, batches_per_commit=2),
                               Die()])
    return hist.history["loss"][-1]


loss = train(state)
with open(f"{out}/rank{bps.rank()}.json", "w") as f:
    json.dump({"fits": fits, "epoch": state.epoch, "batch": state.batch, "loss": loss,
               "size": bps.size()}, f)

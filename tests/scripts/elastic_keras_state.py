"""Single process: KerasState commit/restore and bps.elastic.run (prints KERAS_STATE_OK)."""
import numpy as np
import keras
import byteps.keras as bps
bps.init()
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
m.fit(np.ones((8, 4), np.float32), np.ones((8, 3), np.float32), verbose=0, epochs=1)
state = bps.elastic.KerasState(m, epoch=3)
w0 = [w.copy() for w in m.get_weights()]
o0 = [np.array(v.numpy()) for v in m.optimizer.variables]
m.set_weights([np.zeros_like(w) for w in w0])
m.fit(np.ones((8, 4), np.float32), np.ones((8, 3), np.float32), verbose=0, epochs=1)
state.epoch = 7
state.restore()
assert all(np.array_equal(a, b) for a, b in zip(m.get_weights(), w0))
assert all(np.array_equal(np.array(v.numpy()), b) for v, b in zip(m.optimizer.variables, o0))
assert state.epoch == 3
calls = []

@bps.elastic.run
def train(state):
    calls.append(state.epoch)
    state.epoch += 1
    state.commit()
    return state.epoch

assert train(state) == 4 and calls == [3] and state._saved_state == {"epoch": 4}
print("KERAS_STATE_OK")

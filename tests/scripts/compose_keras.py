"""Single process (tests/test_compose_algorithms.py): a Keras optimizer with an algorithm,
backward_passes_per_step=2 and compression_params: the algorithm runs once per 2 applies on
the local sum and receives the compressor (Algorithm.bind)."""
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
import byteps.tensorflow as bps
from byteps.core import algorithms as A
bps.init()

class Count(A.Algorithm):
    def __init__(self): self.n = 0
    def after_step(self, params): self.n += 1

alg = Count()
opt = bps.DistributedOptimizer(tf.keras.optimizers.SGD(0.5), algorithm=alg,
                               backward_passes_per_step=2,
                               compression_params={"compressor": "int8"})
v = tf.Variable([1.0, 2.0])
for g in ([1.0, 1.0], [3.0, 1.0], [1.0, 1.0], [1.0, 1.0]):
    opt.apply_gradients([(tf.constant(g), v)])
print("after_step calls", alg.n, "value", v.numpy(), "passes", alg.passes, alg.compression_params)
assert alg.n == 2 and alg.passes == 2 and alg.compression_params == {"compressor": "int8"}
np.testing.assert_allclose(v.numpy(), [1 - 0.5 * 6, 2 - 0.5 * 4])
bps.shutdown()
print("OK")

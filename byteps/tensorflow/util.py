"""Small TensorFlow helpers under Horovod's names (``hvd.util._executing_eagerly``)."""
from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """True when TensorFlow runs eagerly (not inside ``tf.function`` or a TF1 graph)."""
    return tf.executing_eagerly()

"""``byteps.tensorflow.keras.elastic``: Horovod's ``horovod.tensorflow.keras.elastic`` path,
for scripts that import from there.  The same names as :mod:`byteps.keras.elastic` (``run``,
``KerasState``, Horovod's elastic callbacks), whose Keras is the one ``tf.keras`` means;
docs/fault_tolerance.md."""
from byteps.keras.elastic import *  # noqa: F401,F403
from byteps.keras.elastic import __all__  # noqa: F401

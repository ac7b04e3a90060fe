"""Gradient compression for the TensorFlow plugin (``Compression.none`` / ``Compression.fp16``)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from byteps.compression.interface import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (half the bytes); others unchanged.

    In DistributedOptimizer / DistributedGradientTape the cast runs in the core's
    compression pipeline (``core_params``), like every other compressor."""
    core_params = {"compressor": "fp16"}

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class CoreCompressor(NoneCompressor):
    """``compression_params`` (the original BytePS keys) for the core's compressors
    (byteps.compression): the tensors stay as they are here, the core compresses
    what leaves the host."""

    def __init__(self, params: dict):
        self.core_params = params

    def __repr__(self) -> str:
        return f"CoreCompressor({self.core_params!r})"


def with_params(compression, compression_params):
    """The compression object for ``compression`` plus ``compression_params``."""
    if not compression_params:
        return compression
    from byteps import compression as _comp
    _comp.parse(compression_params)           # a clear error now, not at the first step
    if compression not in (None, NoneCompressor) and not isinstance(compression,
                                                                     NoneCompressor):
        raise ValueError(f"compression={compression!r} and compression_params="
                         f"{compression_params!r} both choose a compressor; pass one of them")
    return CoreCompressor(dict(compression_params))


def _has_ef(params) -> bool:
    if not params:
        return False
    from byteps import compression as _comp
    spec = _comp.parse(params)
    return bool(spec is not None and getattr(spec, "ef", None))


def current_lr(optimizer):
    """The learning rate the optimizer's next step uses (a tensor; a schedule evaluated
    at the optimizer's iterations), or None when it has none."""
    lr = getattr(optimizer, "learning_rate", None) if optimizer is not None else None
    if lr is None:
        return None
    if callable(lr) and not isinstance(lr, (tf.Variable, tf.Tensor)):
        lr = lr(optimizer.iterations)            # a LearningRateSchedule object
    return tf.convert_to_tensor(lr)


def report_lr(optimizer, *params) -> None:
    """lr-aware error feedback (docs/compression.md): when one of the ``params``
    (compression_params dicts) has error feedback, the optimizer's current learning rate
    goes to the core (``api.set_compression_lr``) before this step's exchange: eagerly
    now, in a graph as an op (stateful ops of a ``tf.function`` run in program order)."""
    if not any(_has_ef(p) for p in params):
        return
    lr = current_lr(optimizer)
    if lr is None:
        return
    from byteps.core import api as core
    if tf.executing_eagerly():
        core.set_compression_lr(float(lr))
        return

    def set_lr(x):
        core.set_compression_lr(float(x))
        return np.int32(0)
    tf.numpy_function(set_lr, [tf.cast(lr, tf.float64)], tf.int32, stateful=True,
                      name="BytePSSetCompressionLr")


class Compression:
    """The available compressors, by the names the original BytePS uses."""
    none = NoneCompressor
    fp16 = FP16Compressor

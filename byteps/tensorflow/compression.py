"""Gradient compression for the TensorFlow plugin (``Compression.none`` / ``Compression.fp16``)."""
from __future__ import annotations

import tensorflow as tf


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


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


class Compression:
    """The available compressors, by the names the original BytePS uses."""
    none = NoneCompressor
    fp16 = FP16Compressor

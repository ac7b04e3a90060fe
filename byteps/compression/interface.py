"""Horovod's per-tensor compression interface, shared by every plugin's ``Compression``.

``compress(tensor) -> (tensor, ctx)`` before the exchange, ``decompress(tensor, ctx) ->
tensor`` after it.  :class:`NoneCompressor` (``Compression.none``, the default) is the same
for every framework; each plugin adds its own ``FP16Compressor``, which casts its
framework's tensors.  (The frame compressors of this package, ``compression_params``, work
on numpy buffers inside the core instead.)
"""
from __future__ import annotations


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

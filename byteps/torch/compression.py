"""Gradient compression for the PyTorch plugin (the original BytePS names).

    opt = bps.DistributedOptimizer(opt, compression=bps.Compression.fp16)

``Compression.fp16`` sends floating-point tensors as float16 and casts the
result back; integer tensors pass through untouched.
"""
from __future__ import annotations

from byteps.compression.interface import Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16; other dtypes are left alone."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != _fp16():
            return tensor.to(_fp16()), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None:
            return tensor.to(ctx)
        return tensor


def _fp16():
    import torch
    return torch.float16


class Compression:
    """Optional gradient compression used by push_pull and DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor

"""``onebit``: sign compression with an optional l1 scale (the original BytePS ``onebit``).

Frame layout (4 + ceil(n/8) bytes)::

    offset 0: float32 scale       mean(|x|) when scaling=True (the original's l1 norm / n),
                                  exactly 1.0 when scaling=False
    offset 4: ceil(n/8) bytes     np.packbits(x < 0): element i is bit (7 - i % 8) of byte
                                  4 + i // 8 (most significant bit first); 1 = negative,
                                  zero (and -0.0, NaN) count as positive; padding bits are 0

Decoded value: ``+scale`` or ``-scale``.  The scale is summed in float32 per block of CHUNK
elements (float64 for a block that overflows float32), in float64 across blocks, then
divided by n and rounded to float32.
"""
from __future__ import annotations

import numpy as np

from .base import (
    CHUNK,
    F32,
    CompressionError,
    Compressor,
    check_input,
    finite_scale,
    frame_view,
    leading_scale,
    scalar_f32,
)

# bit pattern of every byte value, most significant bit first: (256, 8) of 0/1
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)


class OneBit(Compressor):
    """One sign bit per element and one float32 scale per frame."""

    finite_only = True      # the scale check below (finite_scale)

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.frame_bytes = 4 + (n + 7) // 8

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        n = self.n
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        bits = frame[4:]
        neg = np.empty(min(n, CHUNK), dtype=np.bool_)
        tmp = np.empty(min(n, CHUNK), dtype=np.float32) if self.spec.scaling else None
        l1 = 0.0
        for lo in range(0, n, CHUNK):  # CHUNK is a multiple of 8: each block fills whole bytes
            blk = x[lo:lo + CHUNK]
            m = blk.shape[0]
            np.less(blk, 0, out=neg[:m])
            bits[lo // 8:(lo + m + 7) // 8] = np.packbits(neg[:m])
            if tmp is not None:
                a = np.abs(blk, out=tmp[:m])
                with np.errstate(over="ignore"):
                    part = float(a.sum())
                l1 += part if part != np.inf else float(a.sum(dtype=np.float64))
        scale = l1 / n if tmp is not None else 1.0
        finite_scale(scale, self.what, "mean(|x|)")
        frame[:4].view(F32)[0] = scale
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        n = self.n
        if self.spec.scaling:
            scale = leading_scale(frame, self.what, "scale")
        elif (scale := scalar_f32(frame, 0)) != 1.0:
            raise CompressionError(
                f"{self.what}: with scaling=False the scale must be 1.0, the frame has {scale}")
        bits = frame[4:]
        tail = n % 8
        if tail and int(bits[-1]) & ((1 << (8 - tail)) - 1):
            raise CompressionError(f"{self.what}: padding bits of the last byte are not zero")
        table = np.where(_BITS, np.float32(-scale), np.float32(scale))  # (256, 8) float32
        full = n // 8
        rows = out[:full * 8].reshape(full, 8)
        step = CHUNK // 8
        for lo in range(0, full, step):
            hi = min(lo + step, full)
            np.take(table, bits[lo:hi], axis=0, out=rows[lo:hi], mode="clip")
        if tail:
            out[full * 8:] = table[bits[full], :tail]

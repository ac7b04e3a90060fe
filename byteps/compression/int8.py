"""``int8``: per-bucket min-max quantisation to 8 bits (Bagua ByteGrad style).

The partition is cut into nb = ceil(n / bucket) buckets of ``bucket`` elements (the last
one may be shorter).  Frame layout (8 * nb + n bytes)::

    offset 0:      nb x float32   the minimum of each bucket
    offset 4 nb:   nb x float32   the maximum of each bucket
    offset 8 nb:   n  x uint8     codes, element i at byte 8 nb + i

Arithmetic: ``inv = float32(255 / (float64(max) - float64(min)))`` (0 when max == min,
capped at the largest float32), ``q = min(rint(float32(x - min) * inv), 255)``; decoded
``x' = q * step + min`` with ``step = float32((float64(max) - float64(min)) / 255)``, all
float32.  Error bound: ``|x - x'| <= step / 2`` plus float32 rounding of the bucket's
values (a bucket whose max - min exceeds the float32 range may decode to +-inf at its
top).  decompress checks that every min and max is finite and min <= max.
"""
from __future__ import annotations

import numpy as np

from .base import F32, CompressionError, Compressor, check_input, finite_scale, frame_view

_ROWS = 64  # buckets per block in the chunked kernels


def _inverse_range(mn: np.ndarray, mx: np.ndarray) -> np.ndarray:
    rng = mx.astype(np.float64) - mn
    with np.errstate(divide="ignore"):
        inv = np.where(rng > 0, 255.0 / np.where(rng > 0, rng, 1.0), 0.0)
    return np.minimum(inv, np.finfo(np.float32).max).astype(np.float32)


def _step(mn: np.ndarray, mx: np.ndarray) -> np.ndarray:
    return ((mx.astype(np.float64) - mn) / 255.0).astype(np.float32)


class Int8(Compressor):
    """uint8 codes between per-bucket float32 min and max."""

    finite_only = True      # the scale check below (finite_scale)

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.bucket = spec.bucket
        self.nb = -(-n // self.bucket)
        self.frame_bytes = 8 * self.nb + n

    def _blocks(self):
        """Row ranges (lo, hi) of full buckets, _ROWS at a time, then the short bucket."""
        full = self.n // self.bucket
        for lo in range(0, full, _ROWS):
            yield lo, min(lo + _ROWS, full)
        if full < self.nb:
            yield full, self.nb

    def _rows(self, arr: np.ndarray, lo: int, hi: int) -> np.ndarray:
        b = self.bucket
        seg = arr[lo * b:min(hi * b, self.n)]
        return seg.reshape(hi - lo, -1)

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        nb = self.nb
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        mins = frame[:4 * nb].view(F32)
        maxs = frame[4 * nb:8 * nb].view(F32)
        codes = frame[8 * nb:]
        tmp = np.empty(min(self.n, _ROWS * self.bucket), dtype=np.float32)
        for lo, hi in self._blocks():
            xs = self._rows(x, lo, hi)
            mn = np.min(xs, axis=1, out=mins[lo:hi])
            mx = np.max(xs, axis=1, out=maxs[lo:hi])
            self._check_finite(mn, mx, lo)
            t = tmp[:xs.size].reshape(xs.shape)
            with np.errstate(over="ignore"):  # range > float32 max: codes saturate at 255
                np.subtract(xs, mn[:, None], out=t)
                np.multiply(t, _inverse_range(mn, mx)[:, None], out=t)
            np.rint(t, out=t)
            np.minimum(t, np.float32(255), out=t)
            np.copyto(self._rows(codes, lo, hi), t, casting="unsafe")
        return frame

    def _check_finite(self, mn: np.ndarray, mx: np.ndarray, lo: int) -> None:
        bad = ~(np.isfinite(mn) & np.isfinite(mx))
        if bad.any():
            b = int(np.argmax(bad))
            val = float(mn[b]) if not np.isfinite(mn[b]) else float(mx[b])
            finite_scale(val, self.what, f"min/max of bucket {lo + b}")

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        nb = self.nb
        mins = frame[:4 * nb].view(F32)
        maxs = frame[4 * nb:8 * nb].view(F32)
        codes = frame[8 * nb:]
        ok = np.isfinite(mins) & np.isfinite(maxs) & (mins <= maxs)
        if not ok.all():
            b = int(np.argmin(ok))
            raise CompressionError(
                f"{self.what}: bucket {b} has min={float(mins[b])}, max={float(maxs[b])}; "
                "both must be finite with min <= max")
        step = _step(mins, maxs)
        for lo, hi in self._blocks():
            o = self._rows(out, lo, hi)
            with np.errstate(over="ignore"):
                np.multiply(self._rows(codes, lo, hi), step[lo:hi, None], out=o)
                np.add(o, mins[lo:hi, None], out=o)

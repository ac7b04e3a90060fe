"""``dithering``: stochastic quantisation to s levels (the original BytePS ``dithering``).

With ``s = k`` levels, ``norm`` = max|x| (normalize='max') or ||x||_2 (normalize='l2') and
``y = |x| / norm`` in [0, 1], the levels are

    partition='linear':  l_j = j / s                             j = 0..s
    partition='natural': l_0 = 0, l_j = 2**(j - s)               j = 1..s  (2**(1-s) .. 1)

``y`` is rounded to one of its two neighbouring levels ``l_j <= y <= l_{j+1}``: up with
probability ``p = (y - l_j) / (l_{j+1} - l_j)``, so the decoded value is unbiased.  The
uniform numbers are ``u = rng.random(n, dtype=np.float32)`` of
``rng = default_rng(SeedSequence([seed, key & 0xffffffff, key >> 32, part, rnd]))``; an
element goes up when ``u < p``.  Arithmetic (float32): ``y = min(|x| / norm, 1)``; linear:
``t = y * s``, ``j = floor(t)``, ``p = t - j``; natural: ``y < 2**(1-s)`` gives ``j = 0``,
``p = y * 2**(s-1)``, otherwise ``m, e = frexp(y)``, ``j = e - 1 + s``, ``p = 2m - 1``.

Frame layout (4 + n bytes)::

    offset 0: float32 norm          finite, >= 0 (the l2 norm is summed in float64)
    offset 4: n x int8              sign(x) * level index, |index| <= s

Decoded: ``sign * norm * l_|index|`` (float32).  Error bound per element: ``norm / s``
(linear), ``max(|x|, norm * 2**(1-s))`` clipped to ``norm / 2`` (natural).
"""
from __future__ import annotations

import math

import numpy as np

from .base import (
    F32,
    CompressionError,
    Compressor,
    check_input,
    finite_scale,
    frame_view,
    leading_scale,
    rng_for,
)

F32_MAX = float(np.finfo(np.float32).max)
_SIGNED = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int16)  # byte -> int8 value


def levels(s: int, partition: str) -> np.ndarray:
    """The s + 1 levels l_0..l_s in [0, 1] (float32)."""
    if partition == "linear":
        return (np.arange(s + 1, dtype=np.float32) / np.float32(s)).astype(np.float32)
    return np.concatenate([[0.0], 2.0 ** np.arange(1 - s, 1)]).astype(np.float32)


class Dithering(Compressor):
    """One int8 level index per element and one float32 norm per frame."""

    finite_only = True      # the scale check below (finite_scale)

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.s = int(spec.k)
        self.levels = levels(self.s, spec.partition)
        self.frame_bytes = 4 + n

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        s = self.s
        y = np.abs(x)
        if self.spec.normalize == "max":
            norm = float(y.max())
        else:
            norm = math.sqrt(float(np.square(x, dtype=np.float64).sum()))
        finite_scale(norm, self.what, f"{self.spec.normalize} norm")
        if norm > F32_MAX:
            raise CompressionError(f"{self.what}: the l2 norm {norm:.3g} of the gradient "
                                   "exceeds the float32 range; use normalize='max'")
        norm32 = np.float32(norm)
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        frame[:4].view(F32)[0] = norm32
        q = frame[4:].view(np.int8)
        if norm32 == 0:
            q.fill(0)
            return frame
        np.divide(y, norm32, out=y)
        np.minimum(y, np.float32(1), out=y)
        u = rng_for(self.spec.seed, self.key, self.part, rnd).random(self.n, dtype=np.float32)
        if self.spec.partition == "linear":
            np.multiply(y, np.float32(s), out=y)
            j = np.floor(y)
            p = np.subtract(y, j, out=y)
        else:
            small = y < np.float32(2.0 ** (1 - s))
            mant, exp = np.frexp(y)
            j = np.where(small, 0, exp + (s - 1)).astype(np.float32)
            p = np.where(small, y * np.float32(2.0 ** (s - 1)), 2 * mant - 1)
        np.copyto(q, j, casting="unsafe")
        q += np.less(u, p)
        np.negative(q, out=q, where=np.less(x, 0))
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        s = self.s
        norm = leading_scale(frame, self.what, "norm")
        q = frame[4:].view(np.int8)
        lo, hi = int(q.min()), int(q.max())
        if lo < -s or hi > s:
            bad = lo if lo < -s else hi
            raise CompressionError(
                f"{self.what}: level index {bad} out of range; |index| must be <= s={s}")
        mag = np.zeros(256, dtype=np.float32)
        ok = np.abs(_SIGNED) <= s
        mag[ok] = self.levels[np.abs(_SIGNED[ok])] * np.float32(norm)
        table = np.where(_SIGNED < 0, -mag, mag).astype(np.float32)
        np.take(table, frame[4:], out=out, mode="clip")

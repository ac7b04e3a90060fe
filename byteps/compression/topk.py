"""``topk``: the k elements of largest magnitude (the original BytePS ``topk``).

``k`` is a count (>= 1) or a fraction 0 < k < 1 of the partition (ceil(k * n)), clamped
to [1, n].  Frame layout (8k bytes)::

    offset 0:  k x uint32   indices, strictly increasing, each < n
    offset 4k: k x float32  the values x[index], in the same order

Decoded: zeros everywhere except ``out[index] = value`` (exact at the chosen indices).
Among equal magnitudes the choice is np.argpartition's.
"""
from __future__ import annotations

import numpy as np

from .base import F32, U32, CompressionError, Compressor, check_input, frame_view, resolve_k


def check_indices(idx: np.ndarray, n: int, what: str) -> None:
    """Raise unless ``idx`` (uint32) is strictly increasing and every index is < ``n``."""
    if idx.size and int(idx[-1]) >= n:
        raise CompressionError(
            f"{what}: index {int(idx.max())} out of range for a partition of {n} elements")
    if idx.size > 1 and not np.all(idx[1:] > idx[:-1]):
        pos = int(np.argmin(idx[1:] > idx[:-1]))
        raise CompressionError(
            f"{what}: indices must be strictly increasing; entry {pos + 1} is "
            f"{int(idx[pos + 1])} after {int(idx[pos])}")


class TopK(Compressor):
    """Sparse (index, value) pairs of the k largest |x|."""

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.k = resolve_k(spec.k, n)
        self.frame_bytes = 8 * self.k

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        n, k = self.n, self.k
        if k == n:
            idx = np.arange(n, dtype=np.intp)
        else:
            idx = np.argpartition(np.abs(x), n - k)[n - k:]
            idx.sort()
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        frame[:4 * k].view(U32)[:] = idx
        np.take(x, idx, out=frame[4 * k:].view(F32))
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        k = self.k
        idx = frame[:4 * k].view(U32)
        check_indices(idx, self.n, self.what)
        out.fill(0)
        out[idx] = frame[4 * k:].view(F32)

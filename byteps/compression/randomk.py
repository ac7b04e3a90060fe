"""``randomk``: k elements at seeded random positions (the original BytePS ``randomk``).

The positions are a deterministic function of (seed, key, part, rnd)::

    rng = np.random.default_rng(np.random.SeedSequence(
        [seed, key & 0xffffffff, key >> 32, part, rnd]))
    idx = np.sort(rng.choice(n, size=k, replace=False, shuffle=False))

so every rank and the server pick the same positions in a round: the server can add the
values of all workers directly and re-compress the sum at the very same positions.
``k`` is resolved as for topk.  Frame layout (4k bytes)::

    offset 0: k x float32   x[idx], in increasing index order

Decoded: zeros everywhere except ``out[idx] = value`` (no n/k rescaling, as the original).
"""
from __future__ import annotations

import numpy as np

from .base import F32, Compressor, check_input, frame_view, resolve_k, rng_for


class RandomK(Compressor):
    """Values at positions both sides derive from the shared seed; no indices on the wire."""

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.k = resolve_k(spec.k, n)
        self.frame_bytes = 4 * self.k
        self._cached: tuple[int, np.ndarray] | None = None

    def indices(self, rnd: int) -> np.ndarray:
        """The sorted positions of round ``rnd`` (cached for the latest round)."""
        cached = self._cached
        if cached is not None and cached[0] == rnd:
            return cached[1]
        if self.k == self.n:
            idx = np.arange(self.n, dtype=np.intp)
        else:
            rng = rng_for(self.spec.seed, self.key, self.part, rnd)
            idx = rng.choice(self.n, size=self.k, replace=False, shuffle=False)
            idx.sort()
        self._cached = (rnd, idx)
        return idx

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        np.take(x, self.indices(rnd), out=frame.view(F32))
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        out.fill(0)
        out[self.indices(rnd)] = frame.view(F32)

"""``fp16``: half-precision casting (the original MXNet ``{"fp16": True}``).

Frame layout (2n bytes)::

    offset 0: n x float16 (little-endian), element i at bytes [2i, 2i+2)

Values beyond the float16 range are clipped to +-65504 so that no inf goes on the wire
(NaN passes through as NaN: it is data).  Error bound: round-to-nearest float16, i.e.
``|x - D(C(x))| <= 2**-11 * |x|`` for normal values, plus clipping above 65504, plus
``2**-25`` absolute for values in the float16 subnormal range.
"""
from __future__ import annotations

import numpy as np

from .base import Compressor, check_input, frame_view

F16 = np.dtype("<f2")
F16_MAX = 65504.0


class FP16(Compressor):
    """Casts to float16 and back."""

    def __init__(self, spec, n: int, key: int, part: int):
        super().__init__(spec, n, key, part)
        self.frame_bytes = 2 * n

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        check_input(x, self.n, self.what)
        frame = np.empty(self.frame_bytes, dtype=np.uint8)
        # the clip runs in float32, the cast to float16 happens on the store
        np.clip(x, -F16_MAX, F16_MAX, out=frame.view(F16), casting="same_kind")
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        frame = frame_view(buf, self.frame_bytes, self.what)
        check_input(out, self.n, self.what)
        np.copyto(out, frame.view(F16))

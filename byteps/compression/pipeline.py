"""Composition of one partition's compression: momentum -> error feedback -> compressor.

Workers run all three stages (:func:`worker_pipeline`); the server never applies momentum
(:func:`server_pipeline`).  ``compress`` is the only stateful call, once per round;
``decompress`` is stateless, so workers and the server both use it on frames of any rank.

Stages, for a gradient ``x`` of round ``rnd`` (float32 throughout):

* nesterov momentum (the original's): ``m = mu * m + x``; ``x' = x + mu * m``
* vanilla error feedback: ``c = x' + r * (lr_prev / lr_cur)`` (ratio 1 until set_lr has been
  called for two rounds); ``frame = C(c)``; ``r = c - D(frame)``
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .base import CompressionError, Compressor, check_input
from .dithering import Dithering
from .fp16 import FP16
from .int8 import Int8
from .onebit import OneBit
from .randomk import RandomK
from .spec import COMPRESSORS, Spec
from .topk import TopK

REGISTRY: dict[str, type[Compressor]] = {
    "onebit": OneBit, "topk": TopK, "randomk": RandomK, "dithering": Dithering,
    "int8": Int8, "fp16": FP16}
assert tuple(REGISTRY) == COMPRESSORS


def _index(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise CompressionError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


class Pipeline:
    """Compression state of one partition ``part`` of tensor ``key`` (``n`` float32)."""

    def __init__(self, spec: Spec, n: int, key: int, part: int, *, momentum: bool):
        if not isinstance(spec, Spec):
            raise CompressionError(f"expected a compression Spec, got {type(spec).__name__}")
        Spec.from_wire(spec.to_wire(), origin=f"{spec!r}")  # a hand-built Spec: same checks
        self.spec = spec
        self.n = _index("n (partition size)", n, 1, 2**32 - 1)
        self.key = _index("key", key, 0, 2**64 - 1)
        self.part = _index("part", part, 0, 2**32 - 1)
        self.compressor = REGISTRY[spec.compressor](spec, self.n, self.key, self.part)
        self.frame_bytes: int = self.compressor.frame_bytes
        self.residual: np.ndarray | None = (
            np.zeros(self.n, dtype=np.float32) if spec.ef else None)
        self.momentum: np.ndarray | None = (
            np.zeros(self.n, dtype=np.float32) if momentum and spec.momentum else None)
        self._mu = np.float32(spec.mu)
        # reused scratch (a pipeline compresses one round at a time): the next momentum
        # (committed by swapping once the frame exists) and the corrected gradient
        self._spare = np.empty_like(self.momentum) if self.momentum is not None else None
        self._work = (np.empty(self.n, dtype=np.float32)
                      if self.momentum is not None or spec.ef else None)
        self._lr: float | None = None           # learning rate of the coming round
        self._lr_residual: float | None = None  # learning rate the residual was made with

    def __repr__(self) -> str:
        return (f"Pipeline({self.spec.describe()}, n={self.n}, key={self.key}, "
                f"part={self.part}, frame_bytes={self.frame_bytes})")

    def set_lr(self, lr: float) -> None:
        """Learning rate of the coming round; error feedback rescales its residual by it."""
        if self.residual is None:
            return
        if (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                or not math.isfinite(lr) or lr <= 0):
            raise CompressionError(f"learning rate must be a finite number > 0, got {lr!r}")
        self._lr = float(lr)

    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        """A new uint8 frame of ``frame_bytes`` for gradient ``x`` (not modified)."""
        check_input(x, self.n, self.compressor.what)
        rnd = _index("rnd (round)", rnd, 0, 2**63 - 1)
        v, mom = x, None
        if self.momentum is not None:
            mom = np.multiply(self.momentum, self._mu, out=self._spare)
            mom += x
            v = np.multiply(mom, self._mu, out=self._work)
            v += x
        r = self.residual
        if (r is not None or mom is not None) and not self.compressor.finite_only and \
                not np.isfinite(v).all():
            # inf or NaN would stay in the residual or the momentum for good: the round is
            # not compressed (the worker sends it NONFINITE) and the state is kept
            raise CompressionError(f"{self.compressor.what}: the gradient contains inf or "
                                   f"NaN, which error feedback or momentum would keep")
        if r is None:
            frame = self.compressor.compress(v, rnd)
        else:
            ratio = 1.0
            if self._lr is not None and self._lr_residual is not None:
                ratio = self._lr_residual / self._lr
            corr = r * np.float32(ratio) if ratio != 1.0 else r
            v = np.add(v, corr, out=self._work)
            frame = self.compressor.compress(v, rnd)
            self.compressor.decompress(frame, rnd, r)
            np.subtract(v, r, out=r)
            self._lr_residual = self._lr
        if mom is not None:  # committed only once the frame exists
            self.momentum, self._spare = mom, self.momentum
        return frame

    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        """Validate frame ``buf`` and decode it into ``out`` (float32[n]); no state change."""
        rnd = _index("rnd (round)", rnd, 0, 2**63 - 1)
        self.compressor.decompress(buf, rnd, out)


def carry_state(old: list, new: list, n: int) -> None:
    """Re-cut compressor state: ``old`` and ``new`` are ``(start, Pipeline)`` pairs of one
    tensor of ``n`` elements, each pipeline covering elements ``[start, start + p.n)``.
    The error-feedback residual and the momentum move per element, as one whole-tensor
    array sliced anew (elements no old pipeline covered start at zero), and the learning
    rates error feedback rescales by come along, so a tensor cut anew (autotune) goes on
    as if it had never been cut.  The old pipelines are left as they were."""
    src = dict(old)
    for attr in ("residual", "momentum"):
        if not any(getattr(p, attr) is not None for _, p in new):
            continue
        whole = np.zeros(n, np.float32)
        for start, p in old:
            v = getattr(p, attr)
            if v is not None:
                whole[start:start + p.n] = v
        for start, p in new:
            v = getattr(p, attr)
            if v is not None:
                np.copyto(v, whole[start:start + p.n])
    if src:
        first = next(iter(src.values()))
        for _, p in new:
            p._lr, p._lr_residual = first._lr, first._lr_residual


def worker_pipeline(spec: Spec, n: int, key: int, part: int) -> Pipeline:
    """momentum (when spec.momentum) -> error feedback (when spec.ef) -> compressor."""
    return Pipeline(spec, n, key, part, momentum=True)


def server_pipeline(spec: Spec, n: int, key: int, part: int) -> Pipeline:
    """error feedback (when spec.ef) -> compressor; the server never applies momentum."""
    return Pipeline(spec, n, key, part, momentum=False)

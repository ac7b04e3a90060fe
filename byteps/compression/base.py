"""The compressor interface and the helpers every compressor shares.

A compressor turns ``n`` float32 elements into a frame of exactly ``frame_bytes`` bytes
and back.  Frames travel over the network, so :meth:`Compressor.decompress` treats its
input as untrusted: it checks the length and every field before touching ``out`` and
reports problems as :class:`CompressionError`.  All numbers on the wire are little-endian.
"""
from __future__ import annotations

import abc
import math

import numpy as np

F32 = np.dtype("<f4")
U32 = np.dtype("<u4")

#: Elements processed per block by the chunked kernels (keeps temporaries in L2 cache).
CHUNK = 1 << 16


class CompressionError(ValueError):
    """A malformed compressed frame, or compression parameters that cannot be used."""


def rng_for(seed: int, key: int, part: int, rnd: int) -> np.random.Generator:
    """The generator of round ``rnd`` of partition ``part`` of tensor ``key``.

    Every rank and the server derive the same stream from the same four numbers.
    """
    ss = np.random.SeedSequence([seed, key & 0xFFFFFFFF, key >> 32, part, rnd])
    return np.random.default_rng(ss)


def resolve_k(k: float, n: int) -> int:
    """Element count for a ``k`` that is a count (>= 1) or a fraction (0 < k < 1) of ``n``."""
    count = math.ceil(k * n) if isinstance(k, float) and k < 1 else int(k)
    return min(max(count, 1), n)


def frame_view(buf, nbytes: int, what: str) -> np.ndarray:
    """``buf`` (any C-contiguous buffer) as a read-only uint8 array of exactly ``nbytes``."""
    try:
        mv = memoryview(buf)
    except (TypeError, ValueError):
        raise CompressionError(
            f"{what}: a frame must be a bytes-like object (bytes, memoryview, uint8 array), "
            f"got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise CompressionError(f"{what}: the frame buffer is not contiguous")
    if mv.nbytes != nbytes:
        raise CompressionError(
            f"{what}: frame is {mv.nbytes} bytes, expected exactly {nbytes}; "
            "was it compressed with other compression_params or another tensor size?")
    if mv.ndim != 1 or mv.format not in ("B", "b", "c"):
        try:
            mv = mv.cast("B")
        except (TypeError, ValueError) as e:
            raise CompressionError(f"{what}: unusable frame buffer ({e})") from None
    return np.frombuffer(mv, dtype=np.uint8)


def scalar_f32(frame: np.ndarray, offset: int) -> float:
    """The little-endian float32 at byte ``offset`` of ``frame``, as a Python float."""
    return float(frame[offset:offset + 4].view(F32)[0])


def leading_scale(frame: np.ndarray, what: str, name: str) -> float:
    """The float32 at the start of a frame (a scale or norm); raise unless finite and >= 0."""
    value = scalar_f32(frame, 0)
    if not (math.isfinite(value) and value >= 0):
        raise CompressionError(f"{what}: {name} must be finite and >= 0, the frame has {value}")
    return value


def check_input(x, n: int, what: str) -> None:
    """Raise unless ``x`` is a 1-d C-contiguous float32 array of ``n`` elements."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        got = f"{x.dtype}[{x.shape}]" if isinstance(x, np.ndarray) else type(x).__name__
        raise CompressionError(f"{what}: expected a 1-d float32 array, got {got}")
    if x.shape[0] != n or not x.flags.c_contiguous:
        raise CompressionError(
            f"{what}: expected {n} contiguous elements, got {x.shape[0]} "
            f"(contiguous={x.flags.c_contiguous})")


def finite_scale(value: float, what: str, name: str) -> None:
    """Raise when a scale computed from a gradient is inf or NaN (the gradient was)."""
    if not math.isfinite(value):
        raise CompressionError(
            f"{what}: the gradient contains inf or NaN ({name}={value}); "
            "this compressor needs finite gradients (skip the step or lower the loss scale)")


class Compressor(abc.ABC):
    """One compressor for one partition of ``n`` float32 elements of tensor ``key``."""

    #: exact size in bytes of every frame
    frame_bytes: int
    #: compress() raises CompressionError on inf or NaN (a scale computed from them:
    #: onebit, int8, dithering); the others encode them as they are
    finite_only = False

    def __init__(self, spec, n: int, key: int, part: int):
        self.spec, self.n, self.key, self.part = spec, n, key, part
        self.what = f"{spec.compressor} (key={key}, part={part}, n={n})"

    @abc.abstractmethod
    def compress(self, x: np.ndarray, rnd: int) -> np.ndarray:
        """A new uint8 array of ``frame_bytes`` bytes encoding ``x`` (not modified)."""

    @abc.abstractmethod
    def decompress(self, buf, rnd: int, out: np.ndarray) -> None:
        """Validate the frame ``buf`` and write all ``n`` decoded elements into ``out``."""


# ---------------------------------------------------------------- frames with a status byte
def nonfinite_frame(codec) -> np.ndarray:
    """The flagged frame (:func:`compress_flagged`) of a tensor that held inf or NaN."""
    f = np.zeros(codec.frame_bytes + 1, np.uint8)
    f[-1] = 1
    return f


def compress_flagged(codec, x: np.ndarray, rnd: int) -> np.ndarray:
    """``codec``'s frame of ``x`` (a Compressor or a Pipeline) and a status byte, for the
    peer-to-peer exchanges that have no wire flag (process sets, Decentralized): 1 when
    ``x`` held inf or NaN, which is not compressed: the frame is zeros, ``codec``'s state
    is kept, and the receivers read NaN (wire.NONFINITE's rule on the servers' path)."""
    try:
        frame = codec.compress(x, rnd)
    except CompressionError:
        if np.isfinite(x).all():
            raise
        return nonfinite_frame(codec)
    return np.append(frame, np.uint8(0))


def decompress_flagged(codec, buf, rnd: int, out: np.ndarray) -> None:
    """Decode a frame of :func:`compress_flagged` into ``out`` (NaN for a flagged one)."""
    if buf[-1]:
        out.fill(np.nan)
    else:
        codec.decompress(buf[:-1], rnd, out)

"""``compression_params`` of DistributedTrainer (the original BytePS keys), and Horovod's
``Compression`` (``compression=Compression.fp16``: the core's fp16 compressor).

The compressors themselves live in the core (:mod:`byteps.compression`) and run
for every plugin; this module only adapts MXNet's conventions: ``{"fp16": True}``
alone means the ``fp16`` compressor, and compressor momentum (``"momentum":
"nesterov"``) takes ``mu`` from ``optimizer_params["momentum"]``, which is then
removed from the optimizer (the original documents the same move).
"""
from __future__ import annotations

from byteps import compression as _comp
from byteps.compression.interface import Compressor, NoneCompressor


def parse_compression(compression_params, optimizer_params=None):
    """Validate ``compression_params``; return ``(core_params, optimizer_params)``.

    ``core_params`` is what the core's push_pull takes (None: uncompressed);
    ``optimizer_params`` is a copy without ``momentum`` when the compressor does
    the momentum.  Raises TypeError/ValueError naming the key, the allowed values
    and an example.
    """
    if not compression_params:
        return None, optimizer_params
    if not isinstance(compression_params, dict):
        raise TypeError(f"compression_params must be a dict with keys from {_comp.KEYS}, "
                        f"got {type(compression_params).__name__}")
    params = dict(compression_params)
    spec = _comp.parse(params)
    if spec is None:
        return None, optimizer_params
    if spec.momentum:
        opt = dict(optimizer_params or {})
        if "mu" not in params:
            mu = opt.get("momentum")
            if not isinstance(mu, (int, float)) or not 0 < mu < 1:
                raise ValueError(f"compression_params['momentum']={spec.momentum!r} needs "
                                 f"optimizer_params['momentum'] in (0, 1) (the momentum moves "
                                 f"from the optimizer into the compressor), got {mu!r}")
            params["mu"] = float(mu)
        opt.pop("momentum", None)
        optimizer_params = opt
    return params, optimizer_params


class FP16Compressor(Compressor):
    """Floating-point NDArrays as float16; other dtypes are left alone (Horovod)."""

    @staticmethod
    def compress(tensor):
        out = tensor
        if "float" in str(tensor.dtype):
            out = tensor.astype("float16", copy=False)
        return out, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if "float" in str(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class Compression:
    """Horovod's gradient compression choices for ``DistributedTrainer(compression=)``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def horovod_compression(compression, compression_params):
    """``compression_params`` for Horovod's ``compression=`` argument: ``Compression.fp16``
    is the core's fp16 compressor (``{"fp16": True}``); ``Compression.none`` or None adds
    nothing.  Raises ValueError when both arguments ask for compression, TypeError for a
    compressor the core cannot run."""
    if compression is None or compression is NoneCompressor:
        return compression_params
    if compression is not FP16Compressor:
        raise TypeError(f"DistributedTrainer(compression={compression!r}): only "
                        f"Compression.none and Compression.fp16 are Horovod's; for other "
                        f"compressors pass compression_params (e.g. {{'compressor': "
                        f"'onebit', 'ef': 'vanilla'}}, docs/compression.md)")
    if compression_params:
        raise ValueError(f"DistributedTrainer: compression=Compression.fp16 and "
                         f"compression_params={compression_params!r} both given; pass one "
                         f"(compression_params={{'fp16': True}} is the same as the first)")
    return {"fp16": True}

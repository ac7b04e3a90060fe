"""``compression_params`` of DistributedTrainer (the original BytePS keys).

The compressors themselves live in the core (:mod:`byteps.compression`) and run
for every plugin; this module only adapts MXNet's conventions: ``{"fp16": True}``
alone means the ``fp16`` compressor, and compressor momentum (``"momentum":
"nesterov"``) takes ``mu`` from ``optimizer_params["momentum"]``, which is then
removed from the optimizer (the original documents the same move).
"""
from __future__ import annotations

from byteps import compression as _comp


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

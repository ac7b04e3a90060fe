"""``compression_params`` of DistributedTrainer, checked with the original BytePS keys.

Only ``fp16`` (cast gradients to float16 on the wire) is available now; the
compressor chain of the original (onebit, topk, randomk, dithering, error
feedback, momentum) is validated and then refused with a clear error rather
than silently ignored.
"""
from __future__ import annotations

import numbers
import warnings

KEYS = ("compressor", "k", "ef", "momentum", "scaling", "seed", "partition", "normalize",
        "fp16")
COMPRESSORS = ("onebit", "topk", "randomk", "dithering")
_NEEDS_K = ("topk", "randomk", "dithering")
_CHOICES = {"ef": ("vanilla",), "momentum": ("nesterov",), "partition": ("linear", "natural"),
            "normalize": ("max", "l2")}


def parse_compression(compression_params, optimizer_params=None) -> bool:
    """Validate ``compression_params``; return True when gradients travel as float16.

    Raises TypeError/ValueError for malformed parameters and NotImplementedError
    for a compressor, error feedback or compressor momentum (not available yet).
    """
    if not compression_params:
        return False
    cp = compression_params
    if not isinstance(cp, dict):
        raise TypeError(f"compression_params must be a dict with keys from {KEYS}, got "
                        f"{type(cp).__name__}")
    unknown = sorted(set(cp) - set(KEYS), key=str)
    if unknown:
        raise ValueError(f"unknown compression_params key(s) {unknown}; the keys are {KEYS}")
    for item in ("compressor", "ef", "momentum"):
        if cp.get(item) and not isinstance(cp[item], str):
            raise TypeError(f"compression_params[{item!r}] should be str, got {cp[item]!r}")
    for item, choices in _CHOICES.items():
        if cp.get(item) and cp[item] not in choices:
            raise ValueError(f"compression_params[{item!r}]={cp[item]!r} is not supported; "
                             f"choose one of {choices}")
    comp = cp.get("compressor")
    if comp and comp not in COMPRESSORS:
        raise ValueError(f"unknown compressor {comp!r}; the compressors are {COMPRESSORS}")
    if comp in _NEEDS_K:
        if "k" not in cp:
            raise ValueError(f"compressor {comp!r} needs compression_params['k']")
        k = cp["k"]
        if isinstance(k, bool) or not isinstance(k, numbers.Real) or k <= 0:
            raise ValueError(f"compression_params['k'] must be a positive number (a count, or "
                             f"a fraction below 1), got {k!r}")
    if cp.get("seed") is not None and (isinstance(cp["seed"], bool)
                                       or not isinstance(cp["seed"], numbers.Integral)):
        raise TypeError(f"compression_params['seed'] must be an int, got {cp['seed']!r}")
    if cp.get("momentum") and "momentum" not in (optimizer_params or {}):
        raise ValueError("compression_params['momentum'] needs optimizer_params['momentum'] "
                         "(the momentum moves from the optimizer into the compressor)")
    wanted = [f"{item}={cp[item]!r}" for item in ("compressor", "ef", "momentum")
              if cp.get(item)]
    if wanted:
        raise NotImplementedError(
            f"compression_params {', '.join(wanted)}: compressors, error feedback and "
            f"compressor momentum are not available yet in this BytePS; only "
            f"{{'fp16': True}} is. Remove these keys to train uncompressed.")
    ignored = [item for item in ("k", "scaling", "seed", "partition", "normalize")
               if item in cp]
    if ignored:
        warnings.warn(f"compression_params {ignored} only apply to a compressor and are "
                      f"ignored: no 'compressor' is given", stacklevel=3)
    return bool(cp.get("fp16"))

"""User ``compression_params`` -> a validated, normalised, hashable :class:`Spec`.

The keys are the original BytePS ones.  A key whose value is ``None`` counts as absent
(argparse defaults), and so does an empty string for the keys that name a choice: the
original's examples pass ``--compressor``/``--ef``/``--compress-momentum`` with ``''``
defaults, and ``{"compressor": ""}`` means uncompressed there.  Keys that do not apply
to the chosen compressor are ignored with one warning; the :class:`Spec` then holds the
defaults for them, so two ranks with the same effective settings hold equal specs.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import warnings
from collections.abc import Mapping

import numpy as np

from .base import CompressionError

KEYS = ("compressor", "k", "ef", "momentum", "mu", "scaling", "seed", "partition",
        "normalize", "fp16", "bucket")
COMPRESSORS = ("onebit", "topk", "randomk", "dithering", "int8", "fp16")
CHOICES = {"ef": ("vanilla",), "momentum": ("nesterov",), "partition": ("linear", "natural"),
           "normalize": ("max", "l2")}
# keys that apply to one compressor; ef and momentum apply to all, mu with momentum
APPLIES = {"onebit": ("scaling",), "topk": ("k",), "randomk": ("k", "seed"),
           "dithering": ("k", "seed", "partition", "normalize"), "int8": ("bucket",),
           "fp16": ()}
EXAMPLES = {
    "compressor": {"compressor": "onebit", "ef": "vanilla"},
    "k": {"compressor": "topk", "k": 0.01},
    "ef": {"compressor": "onebit", "ef": "vanilla"},
    "momentum": {"compressor": "onebit", "momentum": "nesterov", "mu": 0.9},
    "mu": {"compressor": "onebit", "momentum": "nesterov", "mu": 0.9},
    "scaling": {"compressor": "onebit", "scaling": True},
    "seed": {"compressor": "randomk", "k": 0.01, "seed": 42},
    "partition": {"compressor": "dithering", "k": 4, "partition": "natural"},
    "normalize": {"compressor": "dithering", "k": 4, "normalize": "l2"},
    "fp16": {"fp16": True},
    "bucket": {"compressor": "int8", "bucket": 1024},
}
DITHERING_EXAMPLE = {"compressor": "dithering", "k": 4}
MAX_COUNT = 2**32 - 1   # k as a count: uint32 indices on the wire
MAX_SEED = 2**63 - 1
MAX_BUCKET = 2**31 - 1


def _err(exc: type, key: str, value, rule: str, example=None, hint: str = "") -> Exception:
    ex = EXAMPLES[key] if example is None else example
    return exc(f"compression_params[{key!r}]={value!r} {rule}{hint} (example: {ex!r})")


def _did_you_mean(value, choices) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(key: str, value, choices: tuple) -> str:
    if not isinstance(value, str):
        raise _err(TypeError, key, value, f"must be a string, one of {choices}")
    if value not in choices:
        raise _err(ValueError, key, value, f"is not supported; choose one of {choices}",
                   hint=_did_you_mean(value, choices))
    return value


def _integer(key: str, value, lo: int, hi: int, example=None) -> int:
    """An int in [lo, hi]; integral floats (argparse type=float) are accepted."""
    rule = f"must be an integer in [{lo}, {hi}]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _err(TypeError, key, value, rule, example)
    if not isinstance(value, numbers.Integral) and not (
            math.isfinite(value) and float(value).is_integer()):
        raise _err(ValueError, key, value, rule, example)
    if not lo <= value <= hi:
        raise _err(ValueError, key, value, rule, example)
    return int(value)


def _k(name: str, value):
    if name == "dithering":
        return _integer("k", value, 1, 127, DITHERING_EXAMPLE)
    rule = f"must be a count >= 1 (at most {MAX_COUNT}) or a fraction 0 < k < 1 of the partition"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _err(TypeError, "k", value, rule)
    if not isinstance(value, numbers.Integral) and 0 < value < 1:
        return float(value)
    if not value >= 1:
        raise _err(ValueError, "k", value, rule)
    return _integer("k", value, 1, MAX_COUNT)


def _mu(value) -> float:
    rule = "must be a float with 0 < mu < 1"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _err(TypeError, "mu", value, rule)
    if not 0 < value < 1:
        raise _err(ValueError, "mu", value, rule)
    return float(value)


def _flag(key: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _err(TypeError, key, value, "must be True or False")
    return bool(value)


@dataclasses.dataclass(frozen=True)
class Spec:
    """Normalised compression settings; hashable and comparable across ranks."""

    compressor: str
    k: float | int | None = None
    ef: str | None = None
    momentum: str | None = None
    mu: float = 0.9
    scaling: bool = True
    seed: int = 0
    partition: str = "linear"
    normalize: str = "max"
    bucket: int = 1024

    def to_wire(self) -> list:
        """``[[field, value], ...]`` sorted by field name; msgpack-able."""
        return sorted([f.name, getattr(self, f.name)] for f in dataclasses.fields(self))

    @classmethod
    def from_wire(cls, obj, origin: str = "compression spec from the network") -> Spec:
        """The spec a peer sent (untrusted): every field checked, CompressionError if odd.

        ``origin`` starts the error messages.
        """
        names = {f.name: f.default for f in dataclasses.fields(cls)}
        if not isinstance(obj, (list, tuple)) or len(obj) != len(names):
            raise CompressionError(
                f"{origin}: expected a list of {len(names)} [field, value] pairs, got "
                f"{type(obj).__name__}{f' of {len(obj)}' if isinstance(obj, (list, tuple)) else ''}")
        fields = {}
        for pair in obj:
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not isinstance(pair[0], str) or pair[0] not in names
                    or pair[0] in fields):
                raise CompressionError(
                    f"{origin}: bad or repeated pair {pair!r:.80}")
            fields[pair[0]] = pair[1]
        given = {k: v for k, v in fields.items() if k != "compressor" and v is not None
                 and not (type(v) is type(names[k]) and v == names[k])}
        try:
            name = _choice("compressor", fields["compressor"], COMPRESSORS)
            spec, ignored = _build(name, given)
        except (TypeError, ValueError) as e:
            raise CompressionError(f"{origin}: {e}") from None
        if ignored:
            raise CompressionError(
                f"{origin} sets {ignored}, which do not apply to {name!r}")
        for key, value in fields.items():
            mine = getattr(spec, key)
            if type(mine) is not type(value) or mine != value:
                raise CompressionError(
                    f"{origin}: {key}={value!r:.80} is not normalised")
        return spec

    def describe(self) -> str:
        """Short human text, e.g. ``onebit+ef(vanilla)+momentum(nesterov, mu=0.9)``."""
        c = self.compressor
        text = {"onebit": "onebit" if self.scaling else "onebit(scaling=False)",
                "topk": f"topk(k={self.k})",
                "randomk": f"randomk(k={self.k}, seed={self.seed})",
                "dithering": f"dithering(s={self.k}, {self.partition}, {self.normalize}, "
                             f"seed={self.seed})",
                "int8": f"int8(bucket={self.bucket})", "fp16": "fp16"}[c]
        if self.ef:
            text += f"+ef({self.ef})"
        if self.momentum:
            text += f"+momentum({self.momentum}, mu={self.mu})"
        return text


def _build(name: str, given: dict) -> tuple[Spec, list]:
    """Spec for compressor ``name`` from the other keys; also the keys that do not apply."""
    values, ignored = {}, []
    applies = APPLIES[name] + ("ef", "momentum") + (("mu",) if "momentum" in given else ())
    for key, value in given.items():
        if key not in applies:
            ignored.append(key)
        elif key == "k":
            values["k"] = _k(name, value)
        elif key in CHOICES:
            values[key] = _choice(key, value, CHOICES[key])
        elif key == "mu":
            values["mu"] = _mu(value)
        elif key == "scaling":
            values["scaling"] = _flag(key, value)
        elif key == "seed":
            values["seed"] = _integer("seed", value, 0, MAX_SEED)
        elif key == "bucket":
            values["bucket"] = _integer("bucket", value, 8, MAX_BUCKET)
    if "k" in APPLIES[name] and "k" not in values:
        ex = DITHERING_EXAMPLE if name == "dithering" else {"compressor": name, "k": 0.01}
        rule = "levels, an int 1..127" if name == "dithering" else "a count or a fraction"
        raise ValueError(f"compression_params['k'] is required for compressor {name!r} "
                         f"({rule}) (example: {ex!r})")
    return Spec(compressor=name, **values), sorted(ignored)


#: keys whose value names a choice: "" counts as absent (the original's argparse defaults)
_NAMED = ("compressor", "ef", "momentum", "partition", "normalize")


def parse(params: Mapping | None) -> Spec | None:
    """Validate user ``compression_params``; None or {} (no compressor) -> None."""
    if params is None:
        return None
    if not isinstance(params, Mapping):
        raise TypeError(f"compression_params must be a dict, got {type(params).__name__} "
                        f"(example: {EXAMPLES['compressor']!r})")
    given = {}
    for key, value in params.items():
        if key not in KEYS:
            rule = f"is not a known key; the keys are {KEYS}"
            hint = _did_you_mean(key, KEYS)
            raise ValueError(f"compression_params key {key!r} {rule}{hint} "
                             f"(example: {EXAMPLES['compressor']!r})")
        if value is not None and not (value == "" and key in _NAMED):
            given[key] = value
    fp16 = _flag("fp16", given.pop("fp16")) if "fp16" in given else False
    name = given.pop("compressor", None)
    if name is None:
        if fp16:
            name = "fp16"
        elif given and params.get("compressor") != "":
            raise ValueError(f"compression_params sets {sorted(given)} but no 'compressor'; "
                             f"choose one of {COMPRESSORS} (example: {EXAMPLES['compressor']!r})")
        else:         # {"compressor": "", ...}: the original's "no compressor"
            return None
    name = _choice("compressor", name, COMPRESSORS)
    if fp16 and name != "fp16":
        raise ValueError(f"compression_params['fp16']=True cannot be combined with "
                         f"compressor {name!r}; use one of them (example: {EXAMPLES['fp16']!r} "
                         f"or {{'compressor': {name!r}}})")
    spec, ignored = _build(name, given)
    if ignored:
        warnings.warn(f"compression_params {ignored} do not apply to {spec.describe()} and are "
                      "ignored", stacklevel=3)
    return spec

"""A small YAML emitter for the manifests bpslaunch prints (no PyYAML needed at run time).

Handles what Kubernetes manifests are made of: dicts, lists, strings, ints, floats,
booleans and None.  Strings that a YAML parser could read as anything else (numbers,
booleans, null, or with special characters) are written double-quoted, JSON style,
which is valid YAML.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def scalar(v) -> str:
    """One YAML scalar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _RESERVED:
        return s
    return json.dumps(s)


def _lines(v, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(v, dict):
        if not v:
            return [pad + "{}"]
        out = []
        for k, x in v.items():
            key = scalar(str(k))
            if isinstance(x, (dict, list)) and x:
                out.append(f"{pad}{key}:")
                out += _lines(x, indent + 2)
            else:
                out.append(f"{pad}{key}: {_inline(x)}")
        return out
    if isinstance(v, list):
        if not v:
            return [pad + "[]"]
        out = []
        for x in v:
            if isinstance(x, (dict, list)) and x:
                sub = _lines(x, indent + 2)
                out.append(f"{pad}- {sub[0][indent + 2:]}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_inline(x)}")
        return out
    return [pad + scalar(v)]


def _inline(x) -> str:
    if isinstance(x, dict):
        return "{}"
    if isinstance(x, list):
        return "[]"
    return scalar(x)


def dump(doc) -> str:
    """One YAML document."""
    return "\n".join(_lines(doc, 0)) + "\n"


def dump_all(docs: Iterable) -> str:
    """Several documents separated by ``---``."""
    return "".join("---\n" + dump(d) for d in docs)

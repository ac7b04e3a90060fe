"""The worker: names and keys, partitioning, the engine, local reduction, collectives.

Importing this package loads nothing else (no star import): ``byteps.core.api`` is the
worker API, and its public names stay reachable as ``byteps.core.<name>`` (loaded on
first use).  Every role's floor (errors, config, logging, the scheduler link) is
:mod:`byteps.common`.
"""
from __future__ import annotations

import importlib.util


def __getattr__(name: str):
    """``byteps.core.push_pull`` and the other names of ``byteps.core.api.__all__``."""
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)       # a submodule not imported yet: the import system's job
    from byteps.core import api
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

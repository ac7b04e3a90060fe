"""Helpers Horovod exposes in ``horovod.common.util`` that user and test code import
(``from byteps.common.util import is_version_greater_equal_than, env``)."""
from __future__ import annotations

import contextlib
import os


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """True when version string ``ver`` >= ``target`` (``major.minor.patch``), as Horovod's."""
    from packaging import version
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"is_version_greater_equal_than takes strings, got ver={ver!r} "
                         f"({type(ver).__name__}) and target={target!r} "
                         f"({type(target).__name__})")
    if len(target.split(".")) != 3:
        raise ValueError(f"target must be a version major.minor.patch, got {target!r}")
    return version.parse(ver) >= version.parse(target)


@contextlib.contextmanager
def env(**variables):
    """Set environment ``variables`` for the ``with`` block and restore what was there
    after it (a variable given as None is left alone), as Horovod's ``env``."""
    given = {k: str(v) for k, v in variables.items() if v is not None}
    before = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

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


def _cache(f):
    """Horovod's ``_cache``: ``f``'s result per arguments, computed once."""
    cache: dict = {}

    def wrapper(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in cache:
            cache[key] = f(*args, **kwargs)
        return cache[key]
    return wrapper


# byteps plugin (or Horovod extension) name -> the framework it needs
_FRAMEWORKS = {"torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow",
               "mxnet": "mxnet", "numpy": "numpy"}


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Horovod's ``extension_available``: whether the plugin ``ext_base_name``
    (``"byteps.torch"``, ``"horovod.torch"`` or ``"torch"``) can run here, i.e. its framework
    is installed (found on the path, not imported)."""
    import importlib.util
    mod = _FRAMEWORKS.get(str(ext_base_name).rsplit(".", 1)[-1])
    ok = mod is not None and importlib.util.find_spec(mod) is not None
    if verbose:
        print(f"Extension {ext_base_name} is {'' if ok else 'not '}available.")
    return ok


# What this byteps is built with, answered truthfully for Horovod's queries: the one table
# (byteps.core.collective.ops.build_info; the framework plugins add CUDA and the like)
BUILD = {"mpi_built": False, "mpi_enabled": False, "mpi_threads_supported": False,
         "gloo_built": False, "gloo_enabled": False, "nccl_built": False,
         "ddl_built": False, "ccl_built": False, "cuda_built": False,
         "rocm_built": False, "byteps_built": True}


def mpi_built(verbose: bool = False) -> bool:
    """False: byteps has no MPI (its own scheduler and ZeroMQ)."""
    return BUILD["mpi_built"]


def gloo_built(verbose: bool = False) -> bool:
    """False: byteps has no Gloo (its own scheduler and ZeroMQ)."""
    return BUILD["gloo_built"]


def nccl_built(verbose: bool = False) -> bool:
    """False: the servers sum on CPUs; there are no NCCL operations."""
    return BUILD["nccl_built"]

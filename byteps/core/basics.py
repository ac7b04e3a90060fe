"""Horovod's basic queries, answered once for every plugin (framework-free).

Horovod scripts and test suites ask what the library was built with before anything else
(``hvd.mpi_built()``, ``hvd.gloo_enabled()``, ...).  byteps answers truthfully: it uses
neither MPI, Gloo, DDL nor oneCCL (its own parameter servers over ZeroMQ), and it is
byteps.  What depends on the framework (CUDA, ROCm, NCCL) is answered by each plugin.
The host layout (``cross_rank``, ``cross_size``, ``is_homogeneous``) comes from the core's
ranks.
"""
from __future__ import annotations

from byteps.core import api

__all__ = ["byteps_built", "ccl_built", "cross_rank", "cross_size", "ddl_built", "gloo_built",
           "gloo_enabled", "global_only", "is_homogeneous", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "start_timeline", "stop_timeline"]


def mpi_built() -> bool:
    """False: byteps does not use MPI."""
    return False


def mpi_enabled() -> bool:
    """False: byteps does not use MPI."""
    return False


def mpi_threads_supported() -> bool:
    """False: byteps does not use MPI."""
    return False


def gloo_built() -> bool:
    """False: byteps does not use Gloo (its own parameter servers over ZeroMQ)."""
    return False


def gloo_enabled() -> bool:
    """False: byteps does not use Gloo."""
    return False


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def byteps_built() -> bool:
    """True."""
    return True


def cross_rank() -> int:
    """Index of this worker's host."""
    return api.rank() // api.local_size()


def cross_size() -> int:
    """Number of worker hosts."""
    return api.size() // api.local_size()


def is_homogeneous() -> bool:
    """True when every host runs the same number of workers."""
    return api.size() % api.local_size() == 0


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's timeline: trace this worker into ``file_path`` (docs/timeline.md)."""
    api.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` and write it."""
    api.stop_timeline()


def global_only(process_set, what: str) -> None:
    """Accept ``process_set=None`` or the global process set (id 0); anything else raises
    a ValueError naming the operation (until the core has process sets)."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return
    raise ValueError(f"{what}: process_set={process_set!r} is not supported by this byteps "
                     f"plugin: every worker takes part; pass process_set=None (or the "
                     f"global process set)")

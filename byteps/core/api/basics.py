"""Horovod's basic queries, answered once for every plugin (framework-free).

Horovod scripts and test suites ask what the library was built with before anything else
(``hvd.mpi_built()``, ``hvd.gloo_enabled()``, ...).  byteps answers truthfully: it uses
neither MPI, Gloo, DDL nor oneCCL (its own parameter servers over ZeroMQ), and it is
byteps.  It never uses NCCL either: GPU tensors are copied through host memory in every
plugin, so ``nccl_built()`` is False everywhere.  What depends on the framework (CUDA,
ROCm) is answered by each plugin.
The answers come from :func:`byteps.core.collective.ops.build_info`; the host layout
(``cross_rank``, ``cross_size``, ``is_homogeneous``) from the core's ranks.
"""
from __future__ import annotations

import importlib.util
import numbers
import os

from byteps.core import api


# the names plugins re-export (the core's helpers below them, check_gradient_grouping and
# refuse_async_wrapper, are imported by name where they are used)
__all__ = ["barrier", "byteps_built", "ccl_built", "cross_rank", "cross_size", "ddl_built",
           "export_horovod_env", "global_only", "gloo_built", "gloo_enabled", "init",
           "is_homogeneous", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
           "process_set_kw", "shutdown", "start_timeline", "stop_timeline"]


def _info() -> dict:
    from byteps.core.collective.ops import build_info    # the one table of these facts
    return build_info()


def export_horovod_env() -> None:
    """Set HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, ... as Horovod's launcher does for
    each worker, so scripts that read them find this job's ranks.  Always overwritten: a
    value inherited from a parent process (one that ran its own ``init()``, e.g. a test
    runner) would name another job's ranks."""
    ls = max(1, api.local_size())
    for k, v in (("RANK", api.rank()), ("SIZE", api.size()), ("LOCAL_RANK", api.local_rank()),
                 ("LOCAL_SIZE", ls), ("CROSS_RANK", api.rank() // ls),
                 ("CROSS_SIZE", api.size() // ls)):
        os.environ[f"HOROVOD_{k}"] = str(v)


def init(lazy: bool = False, process_sets=None, comm=None) -> None:
    """Join the job (the core's ``init``), then :func:`export_horovod_env`.

    ``process_sets`` (Horovod's): a list of ``ProcessSet``s or rank lists registered at
    once, in order, on every rank (every rank passes the same sets; the order of the ranks
    within a set does not matter), or ``"dynamic"`` (accepted: sets may always be added
    later).  A set listed twice is a ValueError before the job is joined; a set of every
    rank (the global set) or of ranks beyond the job's size is one before any is
    registered.  ``comm`` (an MPI communicator, or Horovod's list of ranks) is refused:
    byteps does not use MPI."""
    if comm is not None:
        raise ValueError("init(comm=...): byteps does not use MPI; the job is described by "
                         "the DMLC_*/BYTEPS_* environment (bpslaunch); for a subset of the "
                         "ranks use init(process_sets=[...]) or add_process_set()")
    sets = None
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(f"init(process_sets={process_sets!r}): give a list of sets, or "
                             f"'dynamic'")
    elif process_sets is not None:
        from byteps.core.collective import process_sets as _ps
        sets = _ps.initial_sets(process_sets)
    api.init(lazy)
    export_horovod_env()
    if sets:
        _ps.add_initial(sets)


def _get_process_set_ids_and_ranks() -> dict:
    """``{process_set_id: ranks}`` of every registered set, the global one (0) included:
    Horovod's internal function of the same name (``hvd.mpi_ops._basics``), which its test
    suites call."""
    from byteps.core.collective import process_sets as _ps
    return _ps.ids_and_ranks()


def check_gradient_grouping(what: str, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, average: bool = True) -> None:
    """Horovod's ``gradient_predivide_factor``, ``num_groups`` and ``groups`` of a gradient
    wrapper, checked once for every plugin.  They are accepted: the predivide factor splits
    Horovod's averaging around the sum, which gives the same average and changes only its
    rounding, and the groups bundle Horovod's allreduces, where byteps fuses small tensors
    by itself.  Values Horovod refuses are refused with its reasons: a factor that is not
    a positive number, a factor other than 1 when the gradients are summed (no averaging
    to split), and groups that are neither a count nor a list of lists."""
    f = gradient_predivide_factor
    if isinstance(f, bool) or not isinstance(f, numbers.Real) or not f > 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be a number > 0, got {f!r}")
    if f != 1.0 and not average:
        raise ValueError(f"{what}: gradient_predivide_factor={f!r} splits the averaging, but "
                         f"op is not Average (the gradients are summed); leave it at 1.0")
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral) or \
            num_groups < 0:
        raise ValueError(f"{what}: num_groups must be an int >= 0, got {num_groups!r}")
    ok = groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                            and groups >= 0) or \
        (isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups))
    if not ok:
        raise ValueError(f"{what}: groups must be an int >= 0 or a list of lists of "
                         f"variables, got {groups!r}")


def refuse_async_wrapper(wrapper: str) -> None:
    """Refuse asynchronous training (BYTEPS_ENABLE_ASYNC=1 in a distributed job) for a
    ``wrapper`` that averages gradients inside the framework's step (torch DDP,
    TensorFlow's MirroredStrategy): the core's rule ``async-wrapper``, decided here once."""
    cfg = api.get_config()
    if cfg.enable_async and cfg.distributed:
        from byteps.core import compat
        compat.refuse("async-wrapper", f"{wrapper} on rank {api.rank()}")


def shutdown() -> None:
    """Leave the job (the core's ``shutdown``), forgetting process sets and unfinished
    collective handles, so that ``init()`` starts afresh (as byteps.torch does)."""
    from byteps.core.collective import ops as collectives
    api.finish_pending()
    if importlib.util.find_spec("byteps.core.collective.process_sets") is not None:
        from byteps.core.collective import process_sets
        process_sets.reset()
    if hasattr(collectives, "reset"):
        collectives.reset()
    api.shutdown()


def mpi_built() -> bool:
    """False: byteps does not use MPI."""
    return _info()["mpi_built"]


def mpi_enabled() -> bool:
    """False: byteps does not use MPI."""
    return _info()["mpi_enabled"]


def mpi_threads_supported() -> bool:
    """False: byteps does not use MPI."""
    return _info()["mpi_threads_supported"]


def gloo_built() -> bool:
    """False: byteps does not use Gloo (its own parameter servers over ZeroMQ)."""
    return _info()["gloo_built"]


def gloo_enabled() -> bool:
    """False: byteps does not use Gloo."""
    return _info()["gloo_enabled"]


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return _info()["ddl_built"]


def ccl_built() -> bool:
    """False: no oneCCL."""
    return _info()["ccl_built"]


def nccl_built() -> bool:
    """False: byteps has no NCCL stage (GPU tensors go through host memory)."""
    return _info()["nccl_built"]


def byteps_built() -> bool:
    """True."""
    return _info()["byteps_built"]


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
    """Horovod's timeline: rank 0 writes it to ``file_path`` as the job runs
    (docs/timeline.md)."""
    api.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline started by :func:`start_timeline` and close its file."""
    api.stop_timeline()


def process_set_kw(process_set, what: str) -> dict:
    """The keyword arguments that carry ``process_set`` to :mod:`byteps.core.collective.ops`:
    ``{}`` for None or the global set (id 0), ``{"process_set": ps}`` for another registered
    set when the core has process sets (``byteps/core/collective/process_sets.py``);
    otherwise a ValueError naming the operation.  A set that is not registered is refused
    here, where the operation is built (a graph too, as Horovod's), not when it runs."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return {}
    if importlib.util.find_spec("byteps.core.collective.process_sets") is None:
        raise ValueError(f"{what}: process_set={process_set!r} is not supported by this "
                         f"byteps: every worker takes part; pass process_set=None (or the "
                         f"global process set)")
    from byteps.core.collective import process_sets as _ps
    _ps.check_registered(process_set, what)
    return {"process_set": process_set}


def barrier(process_set=None) -> None:
    """Wait until every worker (of ``process_set``) reaches the barrier (the one barrier,
    :func:`byteps.core.collective.ops.barrier`)."""
    from byteps.core.collective import ops as collectives
    collectives.barrier(**process_set_kw(process_set, "barrier"))


def global_only(process_set, what: str) -> None:
    """Accept ``process_set=None`` or the global process set (id 0); anything else raises
    a ValueError naming the operation (for calls that have no process-set form)."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return
    raise ValueError(f"{what}: process_set={process_set!r} is not supported here: every "
                     f"worker takes part; pass process_set=None (or the global process set)")


try:        # the core's process sets, re-exported by every plugin (Horovod's names)
    from byteps.core.collective.process_sets import (  # noqa: F401
        ProcessSet,
        add_process_set,
        global_process_set,
        remove_process_set,
    )
    __all__ += ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
except ImportError:         # a core without process sets: process_set_kw refuses them
    pass

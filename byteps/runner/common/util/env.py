"""Horovod's ``horovod.runner.common.util.env.get_env_rank_and_size``: this process's
rank and job size from the environment, before ``init()``.

bpslaunch gives every worker horovodrun's ``HOROVOD_RANK``/``HOROVOD_SIZE``
(byteps/common/torchrun.py); Open MPI's and PMI's names are read after them, as Horovod
does.  Horovod's test suites call it to size their process sets before ``hvd.init()``."""
from __future__ import annotations

import os

__all__ = ["get_env_rank_and_size"]

_PAIRS = (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
          ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size() -> tuple[int, int]:
    """``(rank, size)`` from the first pair of variables that is set; ``(0, 1)`` when none
    is (a process started without a launcher).  One variable of a pair without the other,
    or a value that is not a count, is a RuntimeError naming them."""
    for rank_var, size_var in _PAIRS:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise RuntimeError(f"cannot tell this process's rank and the job's size: only one "
                               f"of {rank_var} and {size_var} is set; set both (bpslaunch "
                               f"sets both) or neither")
        try:
            r, n = int(rank), int(size)
        except ValueError:
            raise RuntimeError(f"{rank_var}={rank!r} and {size_var}={size!r} must be whole "
                               f"numbers") from None
        if not 0 <= r < n:
            raise RuntimeError(f"{rank_var}={r} is not a rank of a job of {size_var}={n} "
                               f"process(es)")
        return r, n
    return 0, 1

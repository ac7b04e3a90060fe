"""Removal of a job's shared-memory files by name prefix, for every role that makes or
cleans them: the worker's local reduction (:mod:`byteps.core.local.shm`) and ``bpslaunch``
after any exit.  The names themselves (``bps-<job>-...``: :func:`job_prefix`,
:func:`host_prefix`, :func:`shm_dir`) are defined once in :mod:`byteps.transport.shm`.
"""
from __future__ import annotations

import os

from byteps.transport.shm import host_prefix, job_prefix, shm_dir

__all__ = ["host_prefix", "job_prefix", "remove_prefix", "shm_dir"]


def remove_prefix(directory: str, prefix: str) -> list[str]:
    """Unlink every file in ``directory`` whose name starts with ``prefix``; return them."""
    if not prefix.startswith("bps-"):
        raise ValueError(f"refusing to remove files with prefix {prefix!r} (not a BytePS prefix)")
    gone = []
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
                gone.append(name)
            except OSError:          # gone already, or not ours to remove
                pass
    return gone

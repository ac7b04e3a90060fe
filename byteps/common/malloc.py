"""Keep the receive buffers of large messages in the heap (glibc ``mallopt``).

ZeroMQ allocates a fresh buffer for every message it receives.  With glibc's defaults a
buffer of a partition's size (256 KB .. 16 MB) is either ``mmap``-ed or, once the dynamic
threshold has risen, taken from a thread arena whose top is given back to the kernel
whenever more than twice that size is free; either way every received partition
page-faults its memory in again (zeroed by the kernel) and gives it back afterwards.
Measured on loopback with 1 MB partitions (benchmarks/push_pull.py, 1 worker + 1 server):
the worker spent 0.57 CPU seconds per GB moved with the defaults, 0.39 with these settings.

:func:`tune` raises the mmap threshold to glibc's maximum (32 MiB: smaller blocks come from
the heap) and the trim threshold to ``trim_mb`` (free memory at the heap's top up to that
size is kept for the next message).  Larger blocks would still be ``mmap``-ed, whatever the
threshold: a large layer's gradient, which torch allocates again every step after
``zero_grad()`` (``set_to_none=True``, its default), page-faulted in anew each time (118 MB
per step: 54 of 134 ms of one core per backward pass of benchmarks/cluster/train_mlp.py's
two large layers, measured alone); so chunk ``mmap`` is switched off (``M_MMAP_MAX`` 0) and
they come from the heap too (glibc still maps memory when the heap cannot grow, and for
blocks over 64 MB in a thread's arena; autograd runs a CPU backward pass in the caller's
thread, whose arena is the main heap).  ``BYTEPS_MALLOC_TUNE=0`` leaves the process's
allocator alone.  Other C libraries (no ``mallopt``) are left alone too.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_MAX = 32 << 20          # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_done = False


def tune(enabled: bool = True, trim_mb: int = 512) -> bool:
    """Apply the settings once per process; True if they are in effect."""
    global _done
    if _done or not enabled:
        return _done
    try:
        # the process's own symbols hold libc's: find_library would fork ldconfig, ~0.1 s
        # of every worker's and server's start
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_MAX) == 1 and \
        mallopt(M_TRIM_THRESHOLD, trim_mb << 20) == 1 and mallopt(M_MMAP_MAX, 0) == 1
    if not ok:
        log.debug("mallopt refused the byteps settings; the allocator keeps its defaults")
    _done = ok
    return ok

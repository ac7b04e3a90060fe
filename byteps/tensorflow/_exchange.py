"""Numpy side of the TensorFlow plugin: exchanges started now, waited for later.

Nothing here imports TensorFlow.  Each exchange is started with ``start_*``
(returning an integer *ticket*) as soon as its input exists, and all tickets
of a step are waited for together with :func:`wait`, so communication
overlaps the rest of the backward pass.  Inside ``tf.function`` these
functions run in ``tf.numpy_function`` ops; eagerly they are called directly.
"""
from __future__ import annotations

import itertools
import logging
import threading

import numpy as np

from byteps.core import api as core
from byteps.core.collective.carry import carry

log = logging.getLogger("byteps.tensorflow")
_tickets: dict[int, tuple] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _ticket(entry: tuple) -> int:
    with _lock:
        tid = next(_ids)
        _tickets[tid] = entry
    return tid


def start_dense(array: np.ndarray, name: str, average: bool, priority: int = 0,
                shape_in_name: bool = False) -> int:
    """Start summing/averaging ``array`` across workers under ``name``."""
    # A copy: TensorFlow may reuse the input buffer as soon as the op returns,
    # and the core must not see its input change before it is synchronized.
    src = np.array(array, order="C", copy=True)
    shape = src.shape
    if shape_in_name:
        name = f"{name}.{src.dtype}.{'x'.join(map(str, shape)) or 'scalar'}"
    src = src.reshape(-1) if src.ndim == 0 else src     # the core carries arrays, not scalars
    return _ticket(("dense", core.push_pull_async(src, name, average=average,
                                                  priority=priority, out=src), shape))


def start_sparse(values: np.ndarray, indices: np.ndarray, name: str, average: bool,
                 priority: int = 0) -> int:
    """Start gathering the rows of an ``IndexedSlices`` gradient from every worker.

    The servers only sum, so a gather is two sums: first a per-rank row-count
    vector (each rank fills its own slot), then a zero buffer of the total
    length in which each rank writes its rows at its own offset.  The sum is
    the concatenation of all ranks' rows, in rank order.  Buffers are padded
    to a power of two so a varying row count reuses a few names only.
    """
    values = np.asarray(values)
    indices = np.asarray(indices).astype(np.int64, copy=False).reshape(-1)
    if values.ndim < 1 or values.shape[0] != indices.shape[0]:
        raise ValueError(f"sparse gradient {name!r}: {values.shape[0] if values.ndim else 0} "
                         f"value rows but {indices.shape[0]} indices")
    n, r, k = core.size(), core.rank(), indices.shape[0]
    counts = np.zeros(n, np.int64)
    counts[r] = k
    counts = core.push_pull(counts, name + ".counts", average=False, priority=priority)
    total, offset = int(counts.sum()), int(counts[:r].sum())
    if total == 0:
        return _ticket(("sparse", None, None, 0, average, values.dtype, values.shape[1:]))
    bucket = 1 if total <= 1 else 1 << (total - 1).bit_length()
    vbuf = np.zeros((bucket,) + values.shape[1:], values.dtype)
    vbuf[offset:offset + k] = values
    ibuf = np.zeros(bucket, np.int64)
    ibuf[offset:offset + k] = indices
    hv = core.push_pull_async(vbuf, f"{name}.values.{bucket}", average=False,
                              priority=priority, out=vbuf)
    hi = core.push_pull_async(ibuf, f"{name}.indices.{bucket}", average=False,
                              priority=priority, out=ibuf)
    return _ticket(("sparse", hv, hi, total, average, values.dtype, values.shape[1:]))


def start_broadcast(array: np.ndarray, name: str, root_rank: int) -> int:
    """Start sending rank ``root_rank``'s ``array`` to every rank (the core's broadcast and
    dtype table, :func:`byteps.core.api.broadcast_async`, :mod:`byteps.core.collective.carry`)."""
    arr = np.asarray(array)
    wire, back = carry(np.array(arr, order="C", copy=True), copy=True)
    h = core.broadcast_async(wire.reshape(-1) if wire.ndim == 0 else wire, root_rank,
                             "broadcast." + name)
    return _ticket(("bcast", h, back, arr.shape))


def wait(*tickets) -> list[np.ndarray]:
    """Finish the exchanges behind ``tickets``; a sparse one yields (values, indices)."""
    with _lock:
        entries = []
        for t in tickets:
            e = _tickets.pop(int(t), None)
            if e is None:
                raise ValueError(f"unknown or already waited-for byteps ticket {int(t)}")
            entries.append(e)
    out: list[np.ndarray] = []
    errors = []
    for e in entries:     # wait for every handle even after a failure: no stray ops in flight
        try:
            out.extend(_finish(e))
        except Exception as exc:   # noqa: BLE001 - re-raised below with the first cause
            errors.append(exc)
    if errors:
        raise errors[0]
    return out


def wait_step(*tickets) -> list[np.ndarray]:
    """:func:`wait` for a step's gradients, then end the step (the timeline's steps)."""
    out = wait(*tickets)
    core.step_done()
    return out


def _finish(e: tuple) -> list[np.ndarray]:
    kind = e[0]
    if kind == "dense":
        return [core.synchronize(e[1]).reshape(e[2])]
    if kind == "bcast":
        return [e[2](core.synchronize(e[1])).reshape(e[3])]
    _, hv, hi, total, average, dtype, tail = e
    if hv is None:
        return [np.zeros((0,) + tuple(tail), dtype), np.zeros(0, np.int64)]
    errs = []
    res = []
    for h in (hv, hi):
        try:
            res.append(core.synchronize(h))
        except core.BytePSError as exc:
            errs.append(exc)
    if errs:
        raise errs[0]
    values, indices = res[0][:total], res[1][:total]
    if average and core.size() > 1:
        if values.dtype.kind == "f":
            values = values / np.asarray(core.size(), values.dtype)
        else:
            values = values // core.size()
    return [np.ascontiguousarray(values), np.ascontiguousarray(indices)]


def discard(tickets) -> None:
    """Wait for and drop tickets whose results are not needed (error clean-up)."""
    try:
        wait(*tickets)
    except Exception as exc:   # noqa: BLE001 - clean-up after an earlier error
        log.debug("discarded byteps tickets failed too: %s", exc)

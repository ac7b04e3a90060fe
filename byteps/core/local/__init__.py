"""Local reduction among the worker processes of one host (see docs/local_reduction.md).

With ``BYTEPS_LOCAL_SIZE > 1`` and ``BYTEPS_LOCAL_REDUCE`` on (the default),
the local ranks of a host sum their tensors in shared memory first
(reduce-scatter, within PCIe-switch / NUMA groups first), only the reduced
slices go to the servers, and the results come back to every local rank
(all-gather).  Modules:

* :mod:`.shm`       — shared-memory segments and their clean-up by prefix
* :mod:`.reducer`   — the pipelined per-process reduction thread
* :mod:`.stages`    — its data stages (group sum, reduce-scatter, network, all-gather)
* :mod:`.cuts`      — autotune's cuts of a tensor (layout keys, re-cuts, old slice keys)
* :mod:`.parts`     — operation state, slice tensors, peer liveness
* :mod:`.topology`  — PCIe switches / NUMA nodes from sysfs and nvidia-smi
  (NUMA discovery and CPU binding: :mod:`byteps.common.numa`, shared with bpslaunch)
"""
from __future__ import annotations

import contextlib
import logging

log = logging.getLogger("byteps.local")


def enabled(cfg) -> bool:
    """Whether this worker's push_pulls go through the local reduction."""
    return cfg.local_reduce != "off" and cfg.local_size > 1


def start(cfg, engine, book: dict, epoch: int):
    """Create this process's :class:`~byteps.core.local.reducer.LocalReducer`."""
    from byteps.core.local.reducer import LocalReducer
    from byteps.core.local.topology import detect, reduce_groups
    topo = None
    if not cfg.pcie_switch_size:
        try:
            topo = detect()
        except Exception as exc:  # noqa: BLE001 - topology is an optimisation: never fatal
            log.warning("topology detection failed (%s); reducing in one group", exc)
    groups = reduce_groups(cfg.local_size, cfg.pcie_switch_size, topo, cfg.numa_on)
    log.info("local reduction on host %s: mode %s, groups %s", cfg.host_id, cfg.local_reduce,
             groups)
    return LocalReducer(cfg, engine, book, epoch, cfg.local_reduce, groups)


@contextlib.contextmanager
def joined(reducer):
    """Around ``join()``'s wait: with local reduction (``reducer`` not None) this rank adds
    zeros to every operation the other local ranks of its host start, until all joined;
    afterwards the network rounds start at 0 again (see :mod:`.join`)."""
    if reducer is None:
        yield
        return
    reducer.join.begin(reducer.me)
    try:
        yield
    finally:
        reducer.join.end(reducer.rounds)


def push_pull_prereduced_async(like, name: str, pre, average: bool = True, priority: int = 0,
                               out=None) -> int:
    """Start a push_pull whose share on this rank is already summed over its group.

    ``like`` (a numpy array) gives shape and dtype; ``pre(j, a, b)`` returns the group
    sum of elements ``[a, b)`` of chunk ``j`` (see :meth:`.stages.Stages.pre_range`).
    This is how the GPU path hands over the result of its NCCL reduce-scatter; the CPU
    then sums across groups and hosts.  Returns a handle for ``api.synchronize``.
    """
    import numpy as np

    from byteps.core import api
    from byteps.common.errors import BytePSError
    st = api._state()
    if st.local is None:
        raise BytePSError("push_pull of a pre-reduced tensor needs the local reduction "
                          "(BYTEPS_LOCAL_SIZE > 1 and BYTEPS_LOCAL_REDUCE on)")
    like = np.ascontiguousarray(like)
    out = np.empty_like(like) if out is None else out
    t = api._tensor(st, name, like)
    st.steps.pushed(name)
    hid = next(st.ids)
    with st.lock:
        if t.busy is not None:
            raise BytePSError(f"tensor {name!r} is already in flight on rank {st.rank}")
        t.busy = hid
    try:
        st.handles[hid] = st.local.submit(hid, t, like, out, average, priority, pre=pre)
    except BaseException:
        t.busy = None
        raise
    return hid

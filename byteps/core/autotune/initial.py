"""Where autotune starts: good settings at ``init()``, and steps where none are marked
(docs/scaling.md, "Autotune").

**The probe at init.**  A job's first steps used to run with the fixed defaults (4 MB
partitions, 4 of them in flight) until autotune had measured and tried (19 steps).  Now
``init()`` ends with a probe of a few milliseconds: every worker pushes a small tensor of
:data:`PROBE_PARTS` partitions per server twice (the first round declares the keys and
opens the connections' windows; the second is measured by :class:`Probe`, per server:
bytes, busy time, round trip), the workers sum their measurements in one push_pull
(:func:`byteps.core.autotune.pack`, as after autotune's measured steps) and every rank
runs the same pure function on the sums (:func:`choose`): the partition size the cost
model ranks best for a step of :data:`NOMINAL_STEP_BYTES` (the gradients of a ResNet-50;
the real step size is unknown before the first step) and that size's window.  The same
input on every rank, the same decision; no leader.  These become autotune's initial
setting (its trial 0), which it then refines from the measured steps.  Only a job's first
formation probes (every worker is in ``init()`` at once): not an elastic job, not a
re-formed one (``init()`` after ``shutdown()``), nor with both settings explicit, nor a
job on one machine whose payloads go through shared memory (its larger partitions are
measured: ``byteps.core.engine.servers.colocated_config``).

Steps without marks: :mod:`byteps.core.autotune.names`; :func:`infer_boundary` runs
autotune's step boundary where a name repeats.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from byteps.core import autotune as _at

log = logging.getLogger("byteps.autotune")

PROBE_PARTS = 4                 # partitions per server in the probe
PROBE_PART_BYTES = 64 << 10     # 4 x 64 KB per server: 8 ms at 1 Gbit/s with 4 + 4 hosts
NOMINAL_STEP_BYTES = 100e6      # the step the initial partition size is chosen for
OWN = _at.NAME + "."


def infer_boundary(st, name: str, asynchronous: bool) -> None:
    """Before the push of ``name``: end an inferred step if the name repeats (called by
    ``push_pull_async`` outside any lock)."""
    tu = st.tuner
    if tu is None or asynchronous or tu.names is None or \
            not tu.names.pushed(name, idle=not st.steps.busy(st.handles)):
        return
    _at.boundary(st, inferred=True)


def wanted(st) -> bool:
    """Whether ``init()`` probes: a job's first formation (see above), decided from what
    every rank shares (the address book, the checked settings)."""
    from byteps.core.engine.servers import COLOCATED_PARTITION_BYTES
    book = st.book or {}
    one_machine = not st.cfg.partition_explicit and \
        st.cfg.partition_bytes == COLOCATED_PARTITION_BYTES   # servers.colocated_config
    return st.tuner is not None and st.engine is not None and \
        not one_machine and "elastic_gen" not in book and \
        int(book.get("epoch", 1)) & 0xFFFF == 1 and st.nservers > 0


def choose(sums: np.ndarray, nservers: int, cfg, cap: int) -> tuple[int, int] | None:
    """(partition bytes, bytes in flight) from the ranks' summed probe measurements
    (pure: the same on every rank); None when nothing was measured.  An explicit
    ``BYTEPS_PARTITION_BYTES`` or ``BYTEPS_SCHEDULING_CREDIT`` is kept."""
    sums = np.array(sums, np.float64)
    if sums[1] > 0:                 # the model's step: nominal, not the probe's bytes
        sums[2] = NOMINAL_STEP_BYTES * sums[1]
    credit = cfg.scheduling_credit if cfg.credit_explicit else None
    p = _at.plan(sums, nservers, cfg.partition_bytes, not cfg.partition_explicit, credit,
                 cap, cfg.credit_bytes)
    if p is None:
        return None
    best = min(p.predicted, key=lambda r: (r[1], -r[0]))[0]
    if credit is not None:
        return best, max(1, credit) * best
    bw_s, rtt_s = _at.rates(sums, nservers)
    return best, _at.window(best, bw_s, rtt_s)


def probe(st) -> None:
    """Measure every server and start with what autotune would pick (end of ``init()``,
    on every rank of the job at once)."""
    tu, eng = st.tuner, st.engine
    t0 = time.monotonic()
    cfg0 = st.cfg
    small = dataclasses.replace(cfg0, partition_bytes=PROBE_PART_BYTES)
    _use(st, small)
    x = np.zeros(PROBE_PARTS * st.nservers * PROBE_PART_BYTES // 4, np.float32)
    try:
        _at._exchange(st, x, OWN + "probe")         # declares the keys, warms the links
        pr = _at.Probe(st.nservers)
        eng.probe = pr
        t1 = time.monotonic()
        _at._exchange(st, x, OWN + "probe")
        eng.probe, t1 = None, time.monotonic() - t1
        mine = _at.pack(pr.summary(time.monotonic()), 1, x.nbytes)
    finally:
        eng.probe = None
        _use(st, cfg0)
    sums = _at._exchange(st, mine, OWN + "probe.sums")
    got = choose(sums, st.nservers, cfg0, tu.cfg.partition_size())
    if got is None:
        log.info("autotune: the probe at init measured nothing; starting with partitions "
                 "of %d bytes, %d bytes in flight", cfg0.partition_bytes, cfg0.credit_bytes)
        return
    part, credit = got
    if cfg0.partition_explicit:    # the user's size stays (partition_size() caps it per tensor)
        part = cfg0.partition_bytes
    _use(st, dataclasses.replace(cfg0, partition_bytes=part, credit_window=credit))
    tu.initial = tu.partition = part
    tu.credit0 = credit
    bw_s, rtt_s = _at.rates(sums, st.nservers)
    tu.row(0, "probe", part, credit, measured=t1, bw=float(bw_s.sum()),
           rtt=float(rtt_s.max()), note=f"at init, for {NOMINAL_STEP_BYTES:.0f} bytes a step")
    log.info("autotune (rank %d): starting with partitions of %d bytes, %d bytes in flight "
             "(probe at init: %.1f MB/s per worker, round trip %.2f ms; measured in %.1f ms, "
             "%.1f ms with the ranks' agreement)", st.rank, part, credit, bw_s.sum() / 1e6,
             rtt_s.max() * 1e3, t1 * 1e3, (time.monotonic() - t0) * 1e3)


def _use(st, cfg) -> None:
    st.engine.cfg = st.cfg = cfg
    if st.local is not None:
        st.local.cfg = cfg


def after_join(st) -> None:
    """``join()`` returned on every rank (rounds restart together).  The ranks took
    different numbers of steps, so their tuners stand at different points: autotune ends
    here with one setting for all, agreed in one sum over the ranks: the final choice if
    every rank had made the same one, else the starting setting (the probe's, the same
    on every rank).  Tensors are re-cut at their next push when the size changes."""
    tu = st.tuner
    if tu is None or st.engine is None:
        return
    _at.steps.settle(tu)          # an inferred step's exchange: every rank pushed it
    mine = tu.choice if tu.choice is not None and tu.state in ("verify", "done") else (0, 0)
    got = _at._exchange(st, np.array([1.0 if mine[0] else 0.0, *mine], np.float64),
                        OWN + "join")
    n = float(st.size)
    keep = got[0] == n and got[1] == n * mine[0] and got[2] == n * mine[1]
    part, credit = mine if keep else (tu.initial, tu.credit0)
    tu.state = "done"
    tu.set(tu.step, part, credit)
    st.cfg = tu.engine.cfg
    if st.local is not None:
        st.local.cfg = st.cfg
    tu.row(tu.step, "join", part, credit, note="after join(): " + (
        "every rank's choice" if keep else "the ranks stood at different points: the "
        "starting setting") + "; tuning ends")
    tu.write()

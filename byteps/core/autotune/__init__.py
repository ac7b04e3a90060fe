"""Autotune: the partition size and the credit window, chosen from what the first steps
measured (docs/scaling.md, "Autotune").

On by default (``BYTEPS_AUTOTUNE=0`` turns it off); an explicit ``BYTEPS_PARTITION_BYTES``
or ``BYTEPS_SCHEDULING_CREDIT`` always wins.  It starts from a probe at ``init()``
(:mod:`byteps.core.autotune.initial`).  Steps are the explicit ones (``step_done()``, every
plugin's optimizer step); a job that marks none ends a step when a push_pull name repeats
(``names.NameSteps``): the same on every rank.  k = ``BYTEPS_AUTOTUNE_STEPS`` (3).

1. **Measure** (steps 1..k, the initial settings): per server (:class:`Probe`, engine
   thread) the bytes pushed, the time it had pushes in flight (bandwidth) and the ack
   latency less the bytes queued ahead (round trip); each step's wall time too.
2. **Plan** (after step k): the ranks sum their measurements in one small push_pull and
   run the same pure function (:func:`plan`): a size's window is its bandwidth-delay
   product plus two partitions per server (:func:`window`); the trials are the cost
   model's best size (:func:`predict`), the same with twice its window, one size between
   it and the initial one, the initial size with its window.  No leader.
3. **Trials** (k steps each, switched at step boundaries on every rank): a re-cut
   tensor gets a new key (:func:`layout_key`), never a resized slot.
4. **Choose**: the summed median step times decide; the initial setting stays unless
   another is 5 % faster; the other sizes' keys are freed (``autotune/retire.py``).
5. **Overlap or not** (2k more steps, held and sent at once alternating step by step):
   partitions stay held until the first wait unless sending them as pushed was 5 % faster.

Trials, plan and choice go to ``BYTEPS_AUTOTUNE_LOG`` (CSV, ``{rank}`` -> the rank), the
choice to INFO.  Under local reduction the size is the reducer's chunk size; compressed
tensors are re-cut with residual and momentum carried per element
(``engine.compression.recut_pipelines``).  Asynchronous keys keep their first
partitioning (the servers hold their values); their window is tuned too.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import logging
import math
import os
import statistics
import threading
import time

import numpy as np

from byteps.core.autotune import steps
from byteps.core.autotune.names import NameSteps
from byteps.core.pipeline import partitions

log = logging.getLogger("byteps.autotune")

NAME = "byteps.autotune"
CANDIDATES = (256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20)   # + the initial
TRIALS = 3              # settings tried besides the initial one
# Step time one more partition costs, seconds.  benchmarks/scale_calibrate.py measures
# 81 us of CPU per round trip for one worker and one server alone; on the emulated
# 4 + 4 cluster (every role sharing the cores, as on a busy host) 1 MB partitions instead
# of 512 KB saved 0.3 CPU s and 3 % of a 1 s step (docs/scaling.md).
MSG_COST_S = 250e-6
KEEP_UNLESS_GAIN = 0.05    # keep the initial setting unless another is 5 % faster
MAX_SAMPLES = 4096  # per server


class Probe:
    """Per-server measurements of one window of steps (the engine thread writes; the
    user thread reads a summary at a step boundary)."""

    def __init__(self, nservers: int):
        self.n = nservers
        self.reset()

    def reset(self) -> None:
        n = self.n
        self.bytes, self.inflight, self.busy = [0] * n, [0] * n, [0.0] * n
        self.since = [0.0] * n            # when this server's in-flight bytes left zero
        self.ahead: list[collections.deque] = [collections.deque() for _ in range(n)]
        self.samples: list[list] = [[] for _ in range(n)]    # (latency, bytes, ahead)

    def sent(self, server: int, nbytes: int, now: float) -> None:
        """A push of ``nbytes`` to ``server`` left (acks come back in FIFO order)."""
        if self.inflight[server] == 0:
            self.since[server] = now
        self.ahead[server].append(self.inflight[server])
        self.inflight[server] += nbytes

    def acked(self, server: int, nbytes: int, sent_at: float, now: float) -> None:
        q = self.ahead[server]
        ahead = q.popleft() if q else 0
        self.inflight[server] = max(0, self.inflight[server] - nbytes)
        self.bytes[server] += nbytes
        if len(self.samples[server]) < MAX_SAMPLES:
            self.samples[server].append((now - sent_at, ahead + nbytes, ahead))
        if self.inflight[server] == 0:
            self.busy[server] += now - self.since[server]
            q.clear()                     # resends may have left stale entries

    def summary(self, now: float) -> list[tuple[int, float, float]]:
        """Per server: (bytes, busy s, round trip s or -1): the median over pushes with
        nothing queued ahead of the ack latency less their own bytes at the server's rate."""
        out = []
        for s in range(self.n):
            busy = self.busy[s] + (now - self.since[s] if self.inflight[s] else 0.0)
            bw = self.bytes[s] / busy if busy > 0 else 0.0
            rtt = -1.0
            smp = self.samples[s]
            if bw > 0 and smp:
                alone = [lat - q / bw for lat, q, ahead in smp if not ahead]
                rtt = max(0.0, statistics.median(alone or [lat - q / bw for lat, q, _ in smp]))
            out.append((self.bytes[s], busy, rtt))
        return out


def predict(p: int, step_bytes: float, bw: float, nservers: int,
            msg_cost: float = MSG_COST_S) -> float:
    """Predicted seconds of one step's communication with partitions of ``p`` bytes:
    the bytes at the measured rate, the per-partition CPU cost, and the servers' lag,
    ``2 S p / B`` with ``p`` the *full* partition whatever the finer edges (a server
    answers once every worker's copy is in; docs/speed_log.md, eighteenth pass)."""
    if step_bytes <= 0:
        return 0.0
    cut = partitions.lengths(int(step_bytes), p, nservers)     # as one tensor, edges finer
    return step_bytes / bw + len(cut) * msg_cost + 2.0 * min(nservers, len(cut)) * max(cut) / bw


@dataclasses.dataclass(frozen=True)
class Plan:
    trials: tuple            # ((partition bytes, credit bytes), ...); trials[0] = initial
    bandwidth: float         # bytes/s of one worker to all servers
    rtt: float               # seconds, the largest per-server estimate
    step_bytes: float
    predicted: tuple         # ((partition bytes, predicted seconds), ...)


def pack(probe_summary: list, steps: int, step_bytes: int) -> np.ndarray:
    """This rank's measurements for the plan exchange (float64, summed by the servers):
    [ranks that moved bytes, steps, bytes] + per server [bytes, busy, rtt, has rtt]."""
    moved = any(b > 0 for b, _, _ in probe_summary)    # local non-root ranks push nothing
    row = [1.0, float(steps), float(step_bytes)] if moved else [0.0, 0.0, 0.0]
    for b, busy, rtt in probe_summary:
        row += [float(b), float(busy), max(rtt, 0.0), 1.0 if rtt >= 0 else 0.0]
    return np.array(row, np.float64)


def window(p: int, bw_s, rtt_s) -> int:
    """Bytes in flight: per server its bandwidth-delay product plus two partitions (one on
    the wire, one queued: acks wait behind results under load), summed; at least two
    partitions.  Emulated 4 + 4, quiet: at 1 Gbit/s 1 MB partitions with 8 MB in flight
    0.85 of M/B, 4 MB 0.79, 12 MB 0.82; at 200 Mbit/s 256 KB with 2.5 MB 0.80."""
    return max(2 * p, int(sum(b * r + 2 * p for b, r in zip(bw_s, rtt_s))))


def plan(sums: np.ndarray, nservers: int, initial: int, tune_p: bool,
         explicit_credit: int | None, cap: int, credit0: int) -> Plan | None:
    """The trials from the ranks' summed measurements (:func:`pack`; equal inputs, equal
    plans); None: nothing was measured.  Trial 0 is the initial setting (``initial``
    bytes, ``credit0`` in flight); then the model's best size, the candidate nearest the
    geometric middle of that and the initial size (the model is rough), the next best,
    last the initial size with its own window (if a quarter off); TRIALS in all.  The best
    size is also tried with twice its window right after it (emulated 1 Gbit/s: 8 MB in
    flight beat the 4.6 MB bandwidth-delay window by 10 %)."""
    ranks, steps, step_bytes = sums[0], sums[1], sums[2]
    if ranks <= 0 or steps <= 0 or sums[3::4].sum() <= 0:
        return None
    mbytes = step_bytes / steps               # bytes one rank moves per step (mean)
    bw_s, rtt_s = rates(sums, nservers)
    bw = max(float(bw_s.sum()), 1.0)     # a rank's servers' rates add up while they overlap
    p0 = min(initial, cap)

    def credit(p: int) -> int:
        return max(1, explicit_credit) * p if explicit_credit is not None else \
            window(p, bw_s, rtt_s)
    trials = [(p0, credit0)]
    own = [(p0, credit(p0))] if abs(credit(p0) - credit0) > credit0 / 4 else []
    pred = ((p0, predict(p0, mbytes, bw, nservers)),)
    if tune_p:
        pred = tuple((c, predict(c, mbytes, bw, nservers))
                     for c in sorted({c for c in CANDIDATES if c <= cap} | {p0}))
        ranked = [c for c, _ in sorted(pred, key=lambda r: (r[1], -r[0])) if c != p0]
        if ranked:
            mid = math.sqrt(ranked[0] * p0)
            between = [c for c in ranked[1:] if min(ranked[0], p0) < c < max(ranked[0], p0)]
            if between:
                near = min(between, key=lambda c: abs(math.log(c / mid)))
                ranked.remove(near)
                ranked.insert(1, near)
        trials += [(c, credit(c)) for c in ranked]
        if ranked and explicit_credit is None:    # the best size with twice its window
            trials.insert(trials.index((ranked[0], credit(ranked[0]))) + 1,
                          (ranked[0], 2 * credit(ranked[0])))
    trials += own     # the initial size with its own window: last, when sizes are tuned
    return Plan(tuple(trials[:TRIALS + 1]), bw, float(rtt_s.max()), mbytes, pred)


def rates(sums: np.ndarray, nservers: int) -> tuple:
    """Per server: bandwidth (bytes/s) and round trip (s) from summed :func:`pack` rows."""
    per = np.asarray(sums, np.float64)[3:].reshape(nservers, 4)   # bytes, busy, rtt, has
    bw_s = np.where(per[:, 1] > 0, per[:, 0] / np.maximum(per[:, 1], 1e-12), 0.0)
    return bw_s, np.where(per[:, 3] > 0, per[:, 2] / np.maximum(per[:, 3], 1), 0.0)


def pick(scores: np.ndarray) -> int:
    """The fastest trial by summed median step time; trial 0 unless another is faster by
    KEEP_UNLESS_GAIN."""
    best = int(np.argmin(scores))
    return best if scores[best] < scores[0] * (1 - KEEP_UNLESS_GAIN) else 0


def layout_key(base_key: int, partition_bytes: int, initial: int) -> int:
    """The key of a tensor cut into ``partition_bytes``: the name's own key for the
    job's initial partitioning, else that key with the size mixed in (a new server slot,
    declared afresh, never a resized old one)."""
    if partition_bytes == initial:
        return base_key
    import hashlib
    h = hashlib.blake2b(base_key.to_bytes(8, "little") + partition_bytes.to_bytes(8, "little"),
                        digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


class Tuner:
    """One worker's autotune state machine (created by ``byteps.core.api.init``):
    wait -> measure -> trial (one per planned setting) -> verify -> done."""

    def __init__(self, cfg, rank, nservers, engine, tune_partitions: bool, elastic=False):
        self.cfg, self.rank, self.nservers, self.engine = cfg, rank, nservers, engine
        self.k = cfg.autotune_steps
        self.tune_partitions = tune_partitions and not cfg.partition_explicit
        self.initial = self.partition = cfg.partition_bytes
        self.credit0 = cfg.credit_bytes
        self.layout = 0                  # bumped whenever the partition size changes
        self.saved: dict = {}            # (name, key) -> next round, for a key left behind
        self.step, self.state, self.step_bytes = 0, "wait", 0
        self.start = 0                   # first step of the current trial
        self.t_step = time.monotonic()
        self.times: list[list[float]] = [[]]     # step times per trial
        self.probe = Probe(nservers)
        self.plan: Plan | None = None
        self.trial = 0
        self.choice: tuple | None = None         # (partition bytes, credit bytes)
        self.applied_step: int | None = None     # ... applied at this step
        self.changes: list[tuple] = []           # (step, partition bytes, credit bytes)
        self.rows: list[list] = []
        self.retire = None               # retire.Retirer, after the final choice
        # tasks pushed while ``hold`` wait for the next wait (synchronize, poll, barrier...)
        self.hold, self.held = False, []
        self.lock = threading.Lock()
        self.held_t, self.sent_t = [], []     # defer trial: step times held / sent at once
        self.names = None if elastic else NameSteps()   # steps from names (not elastic)
        self.queue, self.pending, self.failed, self.discard = None, None, None, False
        self.log_path = cfg.autotune_log.replace("{rank}", str(rank)) \
            if cfg.autotune_log else None

    def pushed(self, nbytes: int) -> None:
        if self.state == "measure":
            self.step_bytes += nbytes

    def at_step(self, n: int, exchange) -> None:
        """The step counter moved to ``n`` (called outside any lock).  ``exchange(arr,
        name)`` sums ``arr`` over the ranks (a push_pull; every rank is at this boundary)."""
        if n == self.step:
            return
        self.step, now = n, time.monotonic()
        dt, self.t_step = now - self.t_step, now
        if self.discard:              # steps.py: ran before the inferred step's settings
            return setattr(self, "discard", False)
        st = self.state
        if st == "wait":
            self.state, self.start = "measure", n
            self.probe.reset()
            self.engine.probe = self.probe
            return
        if st in ("measure", "trial", "defer", "verify"):
            self.times[-1].append(dt)
            self.row(n, st, self.partition, self.engine.cfg.credit_bytes, measured=dt)
        if st == "measure" and n - self.start >= self.k:
            self.engine.probe = None
            summ = self.probe.summary(now)
            self.make_plan(exchange(pack(summ, n - self.start, self.step_bytes),
                                    NAME + ".plan"), n)
        elif st == "trial" and n - self.start >= self.k:
            if self.trial + 1 < len(self.plan.trials):
                self.trial += 1
                self.set(n, *self.plan.trials[self.trial])
                self.times.append([])
                self.start = n
            else:
                scores = np.array([statistics.median(t) if t else math.inf
                                   for t in self.times], np.float64)
                got = np.asarray(exchange(scores, NAME + ".choice"), np.float64)
                self.finish(pick(got), n, list(got))
        elif st == "defer":
            (self.held_t if self.hold else self.sent_t).append(dt)
            if min(len(self.held_t), len(self.sent_t)) < self.k:
                with self.lock:           # alternate step by step: paired, not drifting
                    self.hold = not self.hold
                return
            med = [statistics.median(t) for t in (self.sent_t, self.held_t)]
            scores = np.asarray(exchange(np.array(med, np.float64), NAME + ".defer"))
            # held (what a push_pull after backward does) unless sending each partition
            # as it is pushed was at least KEEP_UNLESS_GAIN faster: overlap must earn it
            self.hold = not scores[0] < scores[1] * (1 - KEEP_UNLESS_GAIN)
            self.state, self.start = "verify", n
            self.times.append([])
            self.row(n, "defer", self.partition, self.engine.cfg.credit_bytes,
                     note=f"step time sent at once {scores[0]:.4f}, held until the wait "
                     f"{scores[1]:.4f} (sum over ranks): "
                     + ("held" if self.hold else "sent at once"))
            log.info("autotune (rank %d, from step %d): %s", self.rank, n,
                     "partitions wait for the first synchronize after backward (measured "
                     "faster than overlapping it)" if self.hold else
                     "partitions are sent as soon as they are pushed")
            self.write()
        elif st == "verify" and n - self.start >= self.k:
            self.state = "done"
            self.write()

    def make_plan(self, sums, n: int) -> None:
        cap = self.cfg.partition_size()
        credit = self.cfg.scheduling_credit if self.cfg.credit_explicit else None
        p = plan(np.asarray(sums, np.float64), self.nservers, self.initial,
                 self.tune_partitions, credit, cap, self.credit0)
        if p is None:
            log.info("autotune: nothing was measured in %d step(s); keeping partitions of "
                     "%d bytes and %d bytes in flight", self.k, self.partition,
                     self.engine.cfg.credit_bytes)
            self.state = "done"
            return self.write()
        self.plan = p
        for size, t in p.predicted:
            self.row(n, "model", size, "", predicted=t, bw=p.bandwidth, rtt=p.rtt,
                     note=f"{p.step_bytes:.0f} bytes per step")
        if len(p.trials) == 1:           # nothing to try: the window is the choice
            self.finish(0, n, [])
            return
        self.trial, self.start, self.state = 1, n, "trial"
        self.times.append([])
        self.set(n, *p.trials[1])
        self.write()

    def finish(self, best: int, n: int, scores: list) -> None:
        """Apply trial ``best``; then try holding partitions until the wait (k steps)."""
        choice = self.plan.trials[best]
        changed = choice[0] != self.initial
        self.set(n, *choice)
        self.choice, self.applied_step = choice, n
        self.held_t, self.sent_t = [], []
        with self.lock:
            self.hold = True
        self.state, self.start = "defer", n
        self.times.append([])
        p = self.plan
        self.row(n, "choice", choice[0], choice[1], bw=p.bandwidth, rtt=p.rtt,
                 note="step time per trial (sum over ranks): " +
                 " ".join(f"{a}/{b}={s:.4f}" for (a, b), s in zip(p.trials, scores)))
        log.info("autotune (rank %d, from step %d): partitions of %d bytes, %d bytes in "
                 "flight%s (measured %.1f MB/s per worker, round trip %.2f ms; tried %s)",
                 self.rank, n, choice[0], choice[1], " (partition size changed)" if changed
                 else "", p.bandwidth / 1e6, p.rtt * 1e3,
                 ", ".join(f"{a}/{b}" for a, b in p.trials))
        self.write()

    def defer(self, tasks: list) -> bool:
        """Keep ``tasks`` until the next wait when holding (True), else False."""
        with self.lock:
            if not self.hold:
                return False
            self.held.extend(tasks)
            return True

    def release(self) -> None:
        """Send what was held (called by every waiting API call)."""
        if not self.held:
            return
        with self.lock:
            tasks, self.held = self.held, []
        if tasks:
            self.engine.submit(tasks)

    def set(self, n: int, partition: int, credit: int) -> None:
        """Switch to a setting (at a step boundary: the API re-cuts tensors lazily; queued
        until the next one on an inferred step's thread: steps.py)."""
        if self.queue is not None:
            return self.queue.append((n, partition, credit))
        if partition != self.partition:
            self.partition = partition
            self.layout += 1
        self.engine.cfg = dataclasses.replace(self.engine.cfg, partition_bytes=partition,
                                              credit_window=credit)
        self.changes.append((n, partition, credit))

    def row(self, n, kind, partition, credit, predicted=None, measured=None, bw=None,
            rtt=None, note="") -> None:
        def f(v, k):
            return "" if v is None else f"{v * k:.4f}"
        self.rows.append([self.rank, n, kind, partition, credit, f(bw, 1e-6), f(rtt, 1e3),
                          f(predicted, 1), f(measured, 1), note])

    def write(self) -> None:
        if not self.log_path:
            return
        try:
            d = os.path.dirname(self.log_path)
            os.makedirs(d or ".", exist_ok=True)
            with open(self.log_path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["rank", "step", "kind", "partition_bytes", "credit_bytes",
                            "bandwidth_MBps", "rtt_ms", "predicted_s", "measured_s", "note"])
                w.writerows(self.rows)
        except OSError as exc:
            log.warning("cannot write BYTEPS_AUTOTUNE_LOG=%s: %s", self.log_path, exc)


# ------------------------------------------------------------------ the API's side
def start(cfg, st) -> Tuner | None:
    """The worker's tuner, or None: BYTEPS_AUTOTUNE=0, both settings explicit, or
    asynchronous training (workers run different step counts)."""
    if not cfg.autotune or st.engine is None or cfg.enable_async or \
            (cfg.partition_explicit and cfg.credit_explicit):
        return None
    if st.engine.timeline is not None:        # autotune's own exchanges: never traced
        st.engine.timeline.untraced += (NAME + ".",)
    return Tuner(cfg, st.rank, st.nservers, st.engine, tune_partitions=True,
                 elastic="elastic_gen" in (st.book or {}))


def boundary(st, inferred: bool = False) -> None:
    """A step ended: ``step_done()`` (outside the step counter's lock; the first ends the
    inference), or ``inferred`` from a repeated name (names.py; its step: steps.py)."""
    tu = st.tuner
    if not inferred and tu.names is not None:
        tu.names.explicit = True
    tu.release()
    steps.settle(tu)               # the last inferred step's settings apply from here
    chosen = tu.choice      # applied (a choice made on steps.py's thread waits for settle)
    ex = lambda x, name=None: _exchange(st, x, name)    # noqa: E731
    steps.start(tu, tu.step + 1, ex) if inferred else tu.at_step(tu.step + 1, ex)
    if st.cfg is not tu.engine.cfg:
        st.cfg = tu.engine.cfg
        if st.local is not None:
            st.local.cfg = st.cfg           # the reducer's chunks follow the tuned size
    if (chosen if inferred else tu.choice) is not None and tu.tune_partitions:   # at_step: at once
        from byteps.core.autotune import retire        # the servers free the sizes no longer used
        retire.at_boundary(st)


def _exchange(st, x: np.ndarray, name: str) -> np.ndarray:
    """One of autotune's own push_pulls (a sum over the ranks), kept out of the user's
    telemetry: the timeline, the push_pull count and the per-tensor byte table."""
    from byteps.core import api
    eng = st.engine
    hid = api.push_pull_async(x, name, average=False, priority=1 << 30)
    out = api.synchronize(hid)              # (untraced: start() told the timeline)
    with eng.speed.lock:
        eng.speed.total_ops -= 1
        eng.speed.total_bytes -= x.nbytes
    eng.bytes.pop(name, None)
    return out


def relayout(st, t, nbytes: int) -> None:
    """Before a push of tensor ``t``: cut it with the current partition size if the
    layout changed since its last push.
    A tensor whose cut is the same as with the initial size keeps its own key; any other
    gets :func:`layout_key` (rounds continue where that key left them, else from 0)."""
    tu = st.tuner
    tu.pushed(nbytes)
    if t.layout == tu.layout or t.busy is not None:
        return
    t.layout = tu.layout
    if t.wire_flags or not tu.tune_partitions or st.local is not None:
        return       # asynchronous: keeps its first partitioning; local: the reducer cuts
    old = t.parts
    key, p = key_for(st, t, nbytes)
    if key != t.key:
        tu.saved[(t.name, t.key)] = t.round
        t.key, t.round = key, tu.saved.pop((t.name, key), 0)
    t.parts = t.cut(p, st.nservers, key)
    if t.spec is not None and t.parts != old:   # compressor state carried per element
        from byteps.core.engine.compression import recut_pipelines
        recut_pipelines(t, old)


def key_for(st, t, nbytes: int) -> tuple[int, int]:
    """(key, partition bytes) of tensor ``t`` (``nbytes``) under the current partition
    size: the name's own key when the cut is the initial one's, else :func:`layout_key`."""
    from byteps.core.api import tensor_key
    tu = st.tuner
    base = tensor_key(t.name)
    p = st.cfg.partition_size(nbytes, t.name)
    same = [x[2] for x in t.cut(p, st.nservers, base)] == \
        [x[2] for x in t.cut(tu.initial, st.nservers, base)]
    return (base if same else layout_key(base, p, tu.initial)), p


def settings(cfg) -> list:
    """What every worker must agree on (sent at registration; the scheduler refuses a
    worker whose list differs): [autotune on, explicit partition or 0, explicit credit or 0]."""
    return [int(bool(cfg.autotune)), cfg.partition_bytes if cfg.partition_explicit else 0,
            cfg.scheduling_credit if cfg.credit_explicit else 0]

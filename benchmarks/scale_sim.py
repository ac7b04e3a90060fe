"""Flow-level discrete-event model of the byteps PS data path, and of ring all-reduce.

Used by ``benchmarks/scale_model.py`` (validation, predictions, plots) and by
``tests/test_scale_model.py``.  No sockets, no byteps imports: numpy only.

PS data path (what ``byteps/core/engine/`` and ``byteps/server`` do):

* A tensor of M bytes is cut into partitions of ``part`` bytes; partition i goes to server
  ``i mod S``.  Every worker sends them in the same order (the engine's total order), so the
  workers run in lockstep and are modelled as one *class*: a flow "workers -> server s" stands
  for n identical TCP connections (coefficient n on the server's downlink, 1 on each worker's
  uplink).
* A worker keeps at most ``credit * part`` bytes pushed but not yet acknowledged; the server
  acknowledges a push on receipt (one latency later the credit is back).
* Each (worker, server) pair is one TCP connection (ZeroMQ): its messages leave in FIFO order;
  the connections that are sending share every link max-min fairly (progressive filling).
  Links are full duplex: every host has an uplink and a downlink of ``link_Bps``.
* The server spends ``a_s + b_s * bytes`` of CPU per push it receives (receive, sum, and later
  send the result back to that worker); when all n pushes of a partition are summed the result
  goes back on the n server -> worker connections.
* The worker spends ``a_w + b_w * bytes`` per partition (half to send, half to receive and copy
  out), on one CPU queue.
* ``cpu_speed`` scales every CPU cost (1 = a dedicated core per process; the emulated cluster
  shares 2 cores among all processes).
* Compression ratio r (compressed bytes / raw bytes) multiplies the bytes on the wire and the
  per-byte CPU costs (the compressor's own cost is not modelled).
* Colocated mode: server s runs on worker host s; its own worker's push and pull stay on the
  host (no link), and the host's uplink/downlink carry both roles' traffic.

Ring all-reduce: 2(n-1) steps; in each, every member sends M/n to its successor on its own
uplink (all links equally loaded, so the flow model is exact), plus a per-step latency and the
reduction's per-byte CPU cost.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class Cpu:
    """CPU costs in seconds: per message (a) and per byte (b), for the worker and the server."""
    a_w: float = 0.0
    b_w: float = 0.0
    a_s: float = 0.0
    b_s: float = 0.0
    speed: float = 1.0          # fraction of a core each process gets
    server_cores: int = 1       # summation threads that really run in parallel on a server

    def scaled(self, speed: float) -> Cpu:
        return replace(self, speed=speed)


ZERO_CPU = Cpu()


@dataclass
class PSResult:
    time_s: float
    partitions: int
    link_time_s: float          # the busiest link's bytes / link rate (a lower bound)
    trace: list = field(default_factory=list)


def maxmin_rates(coefs: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling.

    coefs[f, r] = how many units of flow f's rate resource r carries (0 if unused);
    caps[r] = capacity.  Returns one rate per flow (every flow uses at least one resource)."""
    nf = coefs.shape[0]
    rates = np.zeros(nf)
    active = np.ones(nf, bool)
    cap = caps.astype(float).copy()
    while active.any():
        load = coefs[active].sum(axis=0)                  # per resource
        used = load > 0
        share = np.full(cap.shape, np.inf)
        share[used] = np.maximum(cap[used], 0.0) / load[used]
        r = int(np.argmin(share))
        inc = share[r]
        # every active flow on the bottleneck resource is frozen at the current level + inc
        rates[active] += inc
        cap -= inc * load
        frozen = active & (coefs[:, r] > 0)
        # also freeze flows on any other resource that just ran out
        tight = used & (cap <= 1e-9 * np.maximum(caps, 1.0))
        frozen |= active & (coefs[:, tight] > 0).any(axis=1)
        active &= ~frozen
    return rates


class _Sim:
    """A fluid network with FIFO connections plus timed events."""

    def __init__(self, resources: dict[str, float]):
        self.names = list(resources)
        self.idx = {k: i for i, k in enumerate(self.names)}
        self.caps = np.array([resources[k] for k in self.names], float)
        self.t = 0.0
        self.timers: list = []
        self.seq = 0
        self.conns: dict = {}            # name -> {"coef": vec, "queue": [[bytes, cb], ...]}
        self.dirty = True
        self.rates: dict = {}

    def at(self, t: float, cb) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (t, self.seq, cb))

    def conn(self, name, coefs: dict[str, float]) -> None:
        v = np.zeros(len(self.names))
        for k, c in coefs.items():
            v[self.idx[k]] += c
        self.conns[name] = {"coef": v, "queue": []}

    def send(self, name, nbytes: float, cb) -> None:
        c = self.conns[name]
        if not c["coef"].any() or nbytes <= 0:      # local (shared memory) or empty
            self.at(self.t, cb)
            return
        c["queue"].append([float(nbytes), cb])
        self.dirty = True

    def _rates(self) -> None:
        act = [k for k, c in self.conns.items() if c["queue"]]
        if act:
            r = maxmin_rates(np.array([self.conns[k]["coef"] for k in act]), self.caps)
            self.rates = dict(zip(act, r))
        else:
            self.rates = {}
        self.dirty = False

    def run(self) -> float:
        while True:
            if self.dirty:
                self._rates()
            dt_flow, _first = math.inf, None
            for k, r in self.rates.items():
                left = self.conns[k]["queue"][0][0]
                d = left / r if r > 0 else math.inf
                if d < dt_flow:
                    dt_flow, _first = d, k
            dt_timer = self.timers[0][0] - self.t if self.timers else math.inf
            if dt_flow == math.inf and dt_timer == math.inf:
                return self.t
            dt = max(0.0, min(dt_flow, dt_timer))
            for k, r in self.rates.items():
                self.conns[k]["queue"][0][0] -= r * dt
            self.t += dt
            # complete every head message that is (numerically) done
            for k in list(self.rates):
                q = self.conns[k]["queue"]
                if q and q[0][0] <= 1e-6:
                    _, cb = q.pop(0)
                    self.dirty = True
                    cb()
            while self.timers and self.timers[0][0] <= self.t + 1e-15:
                _, _, cb = heapq.heappop(self.timers)
                cb()


class _CpuQ:
    """FIFO with k parallel slots."""

    def __init__(self, sim: _Sim, k: int = 1):
        self.sim, self.free = sim, [0.0] * max(1, k)

    def run(self, dur: float, cb) -> None:
        i = int(np.argmin(self.free))
        start = max(self.sim.t, self.free[i])
        self.free[i] = start + dur
        self.sim.at(start + dur, cb)


def partition_sizes(M: float, part: float) -> list[float]:
    n = max(1, math.ceil(M / part))
    return [part] * (n - 1) + [M - part * (n - 1)]


def simulate_ps(M: float, n: int, S: int, link_Bps: float, *, part: float = 4096000,
                credit: int = 4, latency_s: float = 50e-6, ratio: float = 1.0,
                cpu: Cpu = ZERO_CPU, colocated: bool = False,
                server_link_Bps: float | None = None, trace: bool = False) -> PSResult:
    """Time for one push_pull of M bytes by n workers (network clients) through S servers."""
    if n < 1 or S < 1:
        raise ValueError("need n >= 1 and S >= 1")
    if colocated and S > n:
        raise ValueError("colocated: at most one server per worker host")
    B = float(link_Bps)
    Bs = float(server_link_Bps or link_Bps)
    parts = partition_sizes(M, part)
    P = len(parts)
    if colocated:
        res = {}
        for h in range(n):
            res[f"up{h}"] = B
            res[f"down{h}"] = B
        sim = _Sim(res)
        for s in range(S):
            push = {f"up{h}": 1.0 for h in range(n) if h != s}
            if n > 1:
                push[f"down{s}"] = n - 1.0
            pull = {f"down{h}": 1.0 for h in range(n) if h != s}
            if n > 1:
                pull[f"up{s}"] = n - 1.0
            sim.conn(("push", s), push)
            sim.conn(("pull", s), pull)
    else:
        res = {"wup": B, "wdown": B}
        for s in range(S):
            res[f"sdown{s}"] = Bs
            res[f"sup{s}"] = Bs
        sim = _Sim(res)
        for s in range(S):
            sim.conn(("push", s), {"wup": 1.0, f"sdown{s}": float(n)})
            sim.conn(("pull", s), {f"sup{s}": float(n), "wdown": 1.0})
    sp = max(cpu.speed, 1e-9)
    wcpu = _CpuQ(sim, 1)
    scpu = [_CpuQ(sim, min(cpu.server_cores, n)) for _ in range(S)]
    window = max(1, credit) * part
    st = {"next": 0, "inflight": 0.0, "done": 0, "t_done": 0.0}
    log = [] if trace else None

    def dispatch():
        while st["next"] < P:
            i = st["next"]
            if st["inflight"] and st["inflight"] + parts[i] > window:
                return
            st["next"] += 1
            st["inflight"] += parts[i]
            wire = parts[i] * ratio
            wcpu.run((cpu.a_w / 2 + cpu.b_w / 2 * wire) / sp, lambda i=i, w=wire: push(i, w))

    def push(i, wire):
        s = i % S
        if log is not None:
            log.append(("push", i, sim.t))
        sim.send(("push", s), wire, lambda: sim.at(sim.t + latency_s, lambda: arrive(i, wire)))

    def arrive(i, wire):
        s = i % S

        def ack():
            st["inflight"] -= parts[i]
            dispatch()
        sim.at(sim.t + latency_s, ack)
        dur = n * (cpu.a_s + cpu.b_s * wire) / sp / min(cpu.server_cores, n)
        scpu[s].run(dur, lambda: sim.send(("pull", s), wire,
                                          lambda: sim.at(sim.t + latency_s, lambda: got(i, wire))))

    def got(i, wire):
        def fin():
            st["done"] += 1
            st["t_done"] = sim.t
            if log is not None:
                log.append(("done", i, sim.t))
        wcpu.run((cpu.a_w / 2 + cpu.b_w / 2 * wire) / sp, fin)

    sim.at(0.0, dispatch)
    sim.run()
    assert st["done"] == P, (st, P)
    # the busiest link: a worker moves M*r each way; a server n*M*r/S; colocated 2(n-1)/n M r
    if colocated:
        lt = (2 * (n - 1) / n * M * ratio / B) if S == n else max(
            (n - 1) / n * M * ratio / B + (n - 1) * M * ratio / S / B, 0)
    else:
        lt = max(M * ratio / B, n * M * ratio / S / Bs)
    return PSResult(st["t_done"], P, lt, log or [])


def ring_allreduce(M: float, n: int, link_Bps: float, *, latency_s: float = 50e-6,
                   ratio: float = 1.0, b_reduce: float = 0.0, a_step: float = 0.0,
                   speed: float = 1.0) -> float:
    """Ring all-reduce of M bytes among n members on full-duplex links of link_Bps: 2(n-1)
    steps of M/n each (reduce-scatter, then all-gather), each step paying its transfer, one
    latency and a_step of CPU; the reduce-scatter half also reduces (n-1)/n * M bytes."""
    if n <= 1:
        return 0.0
    chunk = M * ratio / n
    steps = 2 * (n - 1)
    return (steps * (chunk / link_Bps + latency_s + a_step / speed)
            + (n - 1) * chunk * b_reduce / speed)


def ps_bound(M: float, n: int, S: int, link_Bps: float, ratio: float = 1.0,
             server_link_Bps: float | None = None) -> float:
    """Closed-form PS lower bound: max(M/B on a worker link, n*M/(S*B_s) on a server link)."""
    Bs = server_link_Bps or link_Bps
    return max(M * ratio / link_Bps, n * M * ratio / (S * Bs))

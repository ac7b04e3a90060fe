"""DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025) on the
parameter servers: each worker takes ``inner_steps`` steps with its own (inner)
optimizer, then pushes its *outer gradient* (the global parameters at the round's start
minus its local ones); the servers average them over the ranks that contributed, apply
the outer optimizer (SGD with Nesterov momentum, :mod:`byteps.server.outer`) to the
global parameters they hold, and every worker pulls the new global parameters.

What travels (docs/algorithms.md):

* **the seed**: :meth:`DiLoCo.init` pushes rank 0's parameters (the others zeros),
  exactly; a server that already holds the parameters keeps them (a re-formed elastic
  group, a worker joining): every rank starts from the global parameters;
* **a round of fragment f**: a tiny synchronous control push_pull of each rank's weight
  (its inner steps in the round; a joined rank adds zero), then each parameter of the
  fragment as ``(global - local) * weight / total`` on an asynchronous key declared with
  the outer optimizer (``wire.outer_field``): compressed when ``compression_params`` is
  given, with error feedback on the worker; the pull answers the new global parameters,
  full precision.

``fragments=F`` cuts the parameters into F groups of tensors (balanced by size) that sync
at staggered steps, ``inner_steps * (f + 1) // F`` then every ``inner_steps``, so the link
carries 1/F of the model at a time.  ``overlap=True`` runs a fragment's exchange on a
background thread while the next inner steps run; when it arrives, the new global
parameters plus the local progress made meanwhile replace the fragment
(``local = new_global + (local - local_at_send)``); ``overlap=k`` (an int) bounds the
overlap to k inner steps, the Streaming DiLoCo paper's tau: an exchange not merged k
steps after its push is waited for then.  ``inner_seconds=T`` ends a
fragment's round by wall time: a background thread agrees with every rank on each round
(a synchronous control push_pull, like AsyncModelAverage's) and each rank weights its
outer gradient by the inner steps it took.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from byteps.common.errors import BytePSError
from byteps.common.outer import outer_step
from byteps.core import api
from byteps.core import state as _st
from byteps.core.algorithms.base import Algorithm, adopt_last_joiner
from byteps.transport.wire import ASYNC


class DiLoCo(Algorithm):
    """Local inner steps, an outer Nesterov step on the servers every ``inner_steps``."""

    compresses = "outer gradients (parameter differences)"

    def __init__(self, inner_steps: int = 500, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True, compression_params=None,
                 fragments: int = 1, overlap: bool | int = False,
                 inner_seconds: float | None = None,
                 prefix: str = "DiLoCo."):
        if type(inner_steps) is not int or inner_steps < 1:
            raise ValueError(f"DiLoCo: inner_steps must be an int >= 1, got {inner_steps!r}")
        if not (type(outer_lr) in (int, float) and 0 < outer_lr <= 1000):
            raise ValueError(f"DiLoCo: outer_lr must be a number in (0, 1000], got "
                             f"{outer_lr!r}")
        if not (type(outer_momentum) in (int, float) and 0 <= outer_momentum < 1):
            raise ValueError(f"DiLoCo: outer_momentum must be a number in [0, 1), got "
                             f"{outer_momentum!r}")
        if type(nesterov) is not bool:
            raise ValueError(f"DiLoCo: nesterov must be a bool, got {nesterov!r}")
        if type(overlap) not in (bool, int) or (type(overlap) is int and overlap < 1):
            raise ValueError(f"DiLoCo: overlap must be a bool or an int >= 1 (the most inner "
                             f"steps an exchange may overlap), got {overlap!r}")
        if type(fragments) is not int or fragments < 1:
            raise ValueError(f"DiLoCo: fragments must be an int >= 1, got {fragments!r}")
        if inner_seconds is not None and not (type(inner_seconds) in (int, float)
                                              and inner_seconds > 0):
            raise ValueError(f"DiLoCo: inner_seconds must be a number > 0 or None, got "
                             f"{inner_seconds!r}")
        self._set_compression(compression_params)
        self.H, self.F = inner_steps, fragments
        self.lr, self.mu, self.nesterov = float(outer_lr), float(outer_momentum), nesterov
        self.overlap, self.seconds, self.prefix = overlap, inner_seconds, prefix
        self.tau = None if type(overlap) is bool else overlap    # overlap=k: merge by k
        self.outer = [self.lr, self.mu, self.nesterov]     # wire.outer_field
        self.log: list = []        # (event, fragment, step): syncs and merges (replays, tests)
        self.rounds = 0            # outer rounds this rank took part in
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def describe(self) -> str:
        return (f"DiLoCo(inner_steps={self.H}, outer_lr={self.lr:g}, outer_momentum="
                f"{self.mu:g}, nesterov={self.nesterov}, fragments={self.F}, overlap="
                f"{self.overlap}, inner_seconds={self.seconds}{self._compressed()})")

    # ------------------------------------------------------------------ set-up
    def init(self, params: dict[str, np.ndarray]) -> None:
        """Cut the fragments, seed the servers with rank 0's parameters (every rank takes
        the global parameters) and start the round schedule."""
        for n, p in params.items():
            if p.dtype.kind != "f":
                raise TypeError(f"DiLoCo: parameter {n!r} is {p.dtype}; the outer "
                                f"optimizer needs floating parameters")
        if self.F > len(params):
            raise ValueError(f"DiLoCo: fragments={self.F} but the model has only "
                             f"{len(params)} parameter tensor(s); use fragments <= "
                             f"{len(params)}")
        self.names = list(params)
        self.frags = _fragments(params, self.F)
        self.latest = params
        self.inflight: dict[int, tuple] = {}     # f -> (thread, box, snapshot)
        self.sent_at: dict[int, int] = {}        # f -> the step its exchange started
        # without servers every rank keeps the servers' state alike (_serverless)
        self.sx: dict = {}                       # the global parameters
        self.m: dict = {}                        # the outer momentum
        self._start(params)
        api.add_join_hook(self._before_join, self._after_join)

    def _start(self, params: dict) -> None:
        """(Re)start on the current group: seed, schedule from step 0."""
        self.state = _st.current()
        self.need_seed = False
        self.step = 0
        self.steps = [0] * self.F              # inner steps since each fragment's sync
        got = self._seed(params)
        self.global_ = got
        if self._serverless():
            self.sx = {n: np.array(v, copy=True) for n, v in got.items()}
            self.m = {}
        for n, p in params.items():
            np.copyto(p, got[n])
        self._start_timer()

    def _restart(self, params: dict) -> None:
        """The group re-formed (elastic) or init() ran again: what was in flight belonged
        to the old group (failed with it); every rank starts again from the global
        parameters the servers hold."""
        for th, _, _ in self.inflight.values():
            th.join()
        self.inflight.clear()
        if self.thread is not None:
            self.stopping = True
            self.run_ok.set()
            self.wake.set()
            self.thread.join()
            self.thread = None
        self.error = None
        self._start(params)

    def _seed(self, params: dict) -> dict:
        """The seed round: rank 0's parameters (others zeros), exact; the servers keep the
        parameters they already hold.  Returns the global parameters."""
        first = api.rank() == 0
        seed = {n: np.ascontiguousarray(p) if first else np.zeros_like(p)
                for n, p in params.items()}
        if self._serverless():         # a sum on the workers: rank 0's parameters, exact
            hs = [(n, api.push_pull_async(a, f"{self.prefix}seed.{n}", average=False,
                                          priority=-i))
                  for i, (n, a) in enumerate(seed.items())]
        else:
            hs = [(n, self._push(n, a, i, exact=True)) for i, (n, a) in enumerate(seed.items())]
        return {n: np.array(api.synchronize(h), copy=True) for n, h in hs}

    def _push(self, n: str, arr: np.ndarray, i: int, exact: bool = False) -> int:
        """Push ``arr`` on parameter ``n``'s outer key (declared with the outer optimizer
        at its first use); returns the handle."""
        name = self.prefix + n
        st = _st._state()
        if name not in st.tensors:
            from byteps.core.pipeline.tensors import _tensor
            t = _tensor(st, name, arr, self.compression_params)
            t.wire_flags, t.outer = ASYNC, self.outer
        return api.push_pull_async(arr, name, average=False, priority=-i, asynchronous=True,
                                   compression_params=self.compression_params,
                                   uncompressed=exact)

    def _serverless(self) -> bool:
        """No server takes part: one process, or one host whose local reduction sums
        everything in shared memory.  Every rank then applies the same outer step to the
        same sum, so the ranks stay identical."""
        st = _st.current()
        return st is None or st.engine is None or (st.local is not None
                                                   and not st.local.network)

    # ------------------------------------------------------------------ steps
    def after_step(self, params: dict[str, np.ndarray]) -> None:
        """Count an inner step; sync the fragments whose round ends here."""
        self._check()
        self.latest = params
        if _st.current() is not self.state:       # a re-formed (elastic) or new group
            self._restart(params)
            return
        if self.need_seed:                        # every rank joined: rounds restart
            self._reseed(params)
            self.need_seed = False
        self.step += 1
        for f in range(self.F):
            self.steps[f] += 1
        self._merge_ready(params)
        if self.tau is not None:                  # overlap=k: waited for after k steps
            for f in [f for f in self.inflight if self.step - self.sent_at[f] >= self.tau]:
                self._merge(f, params)
        for f in self._due():
            self._sync(f, params)

    def _due(self) -> list:
        if self.seconds is not None:              # agreed by the timer thread
            due = []
            while True:
                try:
                    due.append(self.ticks.get_nowait())
                except queue.Empty:
                    return due
        return [f for f in range(self.F)
                if self.step >= self.H * (f + 1) // self.F
                and (self.step - self.H * (f + 1) // self.F) % self.H == 0]

    def _sync(self, f: int, params: dict) -> dict | None:
        """End fragment ``f``'s round on this rank: push its outer gradient, take the new
        global parameters (now, or when they arrive with ``overlap``)."""
        self._wait(f, params)                     # its previous exchange merged first
        snap = {n: np.array(params[n], copy=True) for n in self.frags[f]}
        weight, self.steps[f] = self.steps[f], 0
        self.log.append(("sync", f, self.step))
        if not self.overlap:
            got = self._exchange(f, snap, weight)
            self._apply(f, got, params, snap)
            return got
        box: list = []

        def run():
            try:
                box.append(self._exchange(f, snap, weight))
            except BaseException as exc:          # reported at the next step
                self.error = exc
                box.append(None)
        th = threading.Thread(target=run, name=f"bps-diloco-{f}", daemon=True)
        self.inflight[f] = (th, box, snap)
        self.sent_at[f] = self.step
        th.start()
        return None

    def _exchange(self, f: int, snap: dict, weight: int) -> dict | None:
        """One outer round of fragment ``f``: agree on the total weight, push the weighted
        outer gradients, pull the new global parameters (None: no rank contributed)."""
        self.rounds += 1
        total = float(api.push_pull(np.array([weight], np.float64),
                                    f"{self.prefix}ctl.{f}", average=False)[0])
        if total <= 0:
            return None
        serverless = self._serverless()
        hs = []
        for i, n in enumerate(self.frags[f]):
            d = self.global_[n] - snap[n]
            if weight != total:
                d *= d.dtype.type(weight / total)
            hs.append((n, api.push_pull_async(d, f"{self.prefix}sum.{n}", average=False,
                                              priority=-i) if serverless
                       else self._push(n, d, i)))
        got = {n: api.synchronize(h) for n, h in hs}
        if serverless:                 # the servers' step, on every rank alike
            for n, g in got.items():
                x = self.sx[n]
                outer_step(x, self.m.setdefault(n, np.zeros_like(x)), g, self.lr, self.mu,
                           self.nesterov)
                got[n] = x.copy()
        return got

    def _reseed(self, params: dict) -> dict:
        """Every rank joined: the rounds restart.  The servers keep the global parameters
        (a seed round re-arms them); without servers every rank takes the replica of the
        rank that joined last (it took part in every round).  Returns the global
        parameters, identical on every rank."""
        if not self._serverless():
            return self._seed(params)
        for n, x in self.sx.items():
            self.m.setdefault(n, np.zeros_like(x))
        adopt_last_joiner(self.sx, f"{self.prefix}sx.")
        adopt_last_joiner(self.m, f"{self.prefix}m.")
        return {n: x.copy() for n, x in self.sx.items()}

    def _apply(self, f: int, got: dict | None, params: dict, snap: dict) -> None:
        """Take the new global parameters of fragment ``f`` (plus, with ``overlap``, the
        local progress since the snapshot)."""
        if got is None:
            return
        for n in self.frags[f]:
            if self.overlap:
                params[n] += got[n] - snap[n]
            else:
                np.copyto(params[n], got[n])
            self.global_[n] = got[n]

    def _merge_ready(self, params: dict) -> None:
        for f, (th, box, snap) in list(self.inflight.items()):
            if not th.is_alive():
                self._merge(f, params)

    def _merge(self, f: int, params: dict) -> None:
        th, box, snap = self.inflight.pop(f)
        th.join()
        self._check()
        self._apply(f, box[0], params, snap)
        self.log.append(("merge", f, self.step))

    def _wait(self, f: int, params: dict) -> None:
        if f in self.inflight:
            self._merge(f, params)

    def _wait_all(self, params: dict) -> None:
        for f in list(self.inflight):
            self._merge(f, params)

    def _check(self) -> None:
        if self.error is not None:
            raise BytePSError(f"{self.describe()}: an outer round failed: {self.error}")

    # ------------------------------------------------------------------ join, finish
    def _before_join(self) -> None:
        """This rank joins (out of data): finish its exchanges in flight and the rounds
        every rank agreed on; then it adds nothing until every rank has joined."""
        params = self.latest
        self._wait_all(params)
        if self.seconds is not None:
            self._pause_timer()
            for f in self._due():
                self._sync(f, params)
            self._wait_all(params)

    def _after_join(self) -> None:
        """Every rank joined: the servers restart the rounds (a seed round first), and the
        step schedule restarts on every rank."""
        self.need_seed = True
        self.step = 0
        if self.seconds is not None:
            self._resume_timer()

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """A last round of every fragment with the inner steps taken since its last sync
        (skipped when no rank has any), then every rank takes the global parameters: all
        ranks end identical."""
        self._check()
        api.remove_join_hook(self._before_join, self._after_join)
        if _st.current() is not self.state:
            self._restart(params)
        self._stop_timer()
        self._wait_all(params)
        if self.seconds is not None:          # rounds every rank agreed on before the stop
            for f in self._due():
                self._sync(f, params)
            self._wait_all(params)
        # after an uneven join the ranks' last pulls differ: the seed round's answer (the
        # servers' parameters, identical everywhere) stands in where no rank has steps left
        seeded = self._reseed(params) if self.need_seed else {}
        self.need_seed = False
        overlap, self.overlap = self.overlap, False
        try:
            for f in range(self.F):
                if self._sync(f, params) is None:
                    self.global_.update((n, seeded[n]) for n in self.frags[f] if n in seeded)
        finally:
            self.overlap = overlap
        for n, p in params.items():
            np.copyto(p, self.global_[n])

    # ------------------------------------------------------------------ inner_seconds
    def _start_timer(self) -> None:
        if self.seconds is None:
            return
        st = _st.current()
        if st is None or st.engine is None:       # one process: its own clock
            self.ticks = _LocalTicks(self)
            return
        self.ticks = queue.SimpleQueue()
        self.stopping = False
        self.run_ok, self.idle = threading.Event(), threading.Event()
        self.run_ok.set()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._timer, name="bps-diloco-timer",
                                       daemon=True)
        self.thread.start()

    def _timer(self) -> None:
        """Every rank's rounds by wall time: tick k of fragment f is due at
        ``(k + (f + 1) / F) * inner_seconds``; each tick is agreed by a synchronous control
        push_pull (stop when any rank finishes), so every rank takes the same rounds."""
        t0, k = time.monotonic(), 0
        try:
            while True:
                f = k % self.F
                due = t0 + (k // self.F + (f + 1) / self.F) * self.seconds
                self.wake.wait(max(0.0, due - time.monotonic()))
                if not self.run_ok.is_set():
                    self.idle.set()
                    self.run_ok.wait()
                    self.idle.clear()
                    t0, k = time.monotonic(), 0
                    continue
                ctl = api.push_pull(np.array([float(self.stopping)]),
                                    f"{self.prefix}tick", average=False)
                if ctl[0] > 0:
                    return
                self.ticks.put(f)
                k += 1
        except BaseException as exc:
            self.error = exc

    def _pause_timer(self) -> None:
        if self.thread is None:
            return
        self.run_ok.clear()
        self.wake.set()
        while self.thread.is_alive() and not self.idle.is_set():
            self.idle.wait(0.01)
        self.wake.clear()

    def _resume_timer(self) -> None:
        if self.thread is not None:
            self.run_ok.set()

    def _stop_timer(self) -> None:
        if self.thread is None:
            return
        self.stopping = True
        self.run_ok.set()
        self.wake.set()
        self.thread.join()
        self.thread = None
        self._check()


class _LocalTicks:
    """inner_seconds without servers: the rounds come from this process's clock."""

    def __init__(self, alg: DiLoCo):
        self.alg, self.t0, self.k = alg, time.monotonic(), 0

    def get_nowait(self) -> int:
        a = self.alg
        f = self.k % a.F
        if time.monotonic() < self.t0 + (self.k // a.F + (f + 1) / a.F) * a.seconds:
            raise queue.Empty
        self.k += 1
        return f


def _fragments(params: dict, F: int) -> list[list[str]]:
    """The parameter names cut into ``F`` groups of similar size (largest tensors first,
    each to the lightest group; the same on every rank), each in the model's order."""
    order = sorted(range(len(params)), key=lambda i: -list(params.values())[i].size)
    names = list(params)
    load, groups = [0] * F, [[] for _ in range(F)]
    for i in order:
        g = min(range(F), key=lambda j: (load[j], j))
        groups[g].append(i)
        load[g] += list(params.values())[i].size
    return [[names[i] for i in sorted(g)] for g in groups]

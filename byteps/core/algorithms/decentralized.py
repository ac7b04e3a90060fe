"""Decentralized SGD (Bagua's ``decentralized`` and ``low_precision_decentralized``):
workers average their models with peers, worker to worker, without the servers.

The update rule (adapt, then combine), after every local optimizer step ``x_i``:

* ``Decentralized(peer_selection="all")``: ``x_i <- mean_j x_j`` over every rank; the
  sum runs in rank order on every rank, so every rank holds bit-identical parameters.
* ``Decentralized(peer_selection="shift_one")``: at step ``t`` (counting communication
  steps from 0) the distance is ``d = 1 + t mod (n - 1)``; rank ``i`` sends its model to
  ``(i + d) mod n``, receives the model of ``p = (i - d) mod n`` and sets
  ``x_i <- (x_min(i,p) + x_max(i,p)) / 2`` (the ring with a shifting distance: one
  message out and one in per step, every pair meets within ``n - 1`` steps, and the
  mixing matrix is doubly stochastic, so the mean of the models follows plain SGD).
* ``LowPrecisionDecentralized()``: the ring (left and right neighbours) with 8-bit
  quantised differences (CHOCO-SGD).  Every rank keeps replicas ``h_j`` of its own and
  its neighbours' models that all holders update identically: a rank sends
  ``q = int8(x_i - h_i)`` (byteps.compression int8 frames), adds the decoded ``q`` to
  ``h_i`` and the neighbours' decoded ``q_j`` to ``h_j``, then mixes
  ``x_i <- x_i + gamma * sum_j w (h_j - h_i)`` with ``w = 1 / (neighbours + 1)``.  The
  quantisation error of a step stays in ``x_i - h_i`` and is sent with the next one
  (error compensation).

``finish()`` averages the models exactly through the servers, so every rank ends with
identical parameters.  Messages go through :mod:`byteps.core.peers` (authenticated,
validated; a dead peer ends the wait with an error naming it).
"""
from __future__ import annotations

import hashlib

import numpy as np

from byteps.compression import CompressionError
from byteps.core import api
from byteps.core.algorithms.base import Algorithm, average_now

KIND_RAW, KIND_INT8 = 0, 1
SELECTIONS = ("all", "shift_one")


def layout_id(params: dict[str, np.ndarray]) -> int:
    """63-bit fingerprint of the names, shapes and dtypes (peers must agree)."""
    h = hashlib.blake2b(digest_size=8)
    for n in sorted(params):
        h.update(f"{n}|{params[n].shape}|{params[n].dtype.str};".encode())
    return int.from_bytes(h.digest(), "little") >> 1


def shift_one_peers(rank: int, size: int, step: int) -> tuple[int, int]:
    """(send to, receive from) at communication step ``step``."""
    d = 1 + step % (size - 1)
    return (rank + d) % size, (rank - d) % size


class _Flat:
    """The parameters as one contiguous vector (sorted names), and back."""

    def __init__(self, params: dict[str, np.ndarray]):
        self.names = sorted(params)
        kinds = {params[n].dtype.kind for n in self.names}
        if kinds - {"f"}:
            bad = [n for n in self.names if params[n].dtype.kind != "f"]
            raise TypeError(f"decentralized algorithms average floating parameters; "
                            f"{bad[:3]} are not floating")
        self.dtype = np.result_type(*[params[n].dtype for n in self.names]) \
            if self.names else np.dtype(np.float32)
        self.sizes = [params[n].size for n in self.names]
        self.n = int(sum(self.sizes))

    def gather(self, params: dict[str, np.ndarray]) -> np.ndarray:
        out = np.empty(self.n, self.dtype)
        o = 0
        for name, k in zip(self.names, self.sizes):
            out[o:o + k] = params[name].reshape(-1)
            o += k
        return out

    def scatter(self, flat: np.ndarray, params: dict[str, np.ndarray]) -> None:
        o = 0
        for name, k in zip(self.names, self.sizes):
            params[name][...] = flat[o:o + k].reshape(params[name].shape)
            o += k


class _PeerAlgorithm(Algorithm):
    prefix = "Decentralized."

    def __init__(self, communication_interval: int):
        if type(communication_interval) is not int or communication_interval < 1:
            raise ValueError(f"communication_interval must be an int >= 1, got "
                             f"{communication_interval!r}")
        self.interval = communication_interval
        self.steps = 0            # local steps
        self.comm = 0             # communication steps
        self.net = None
        self.flat: _Flat | None = None
        self.rank, self.size = -1, 0          # set by init()

    def _setup(self, params: dict[str, np.ndarray]) -> bool:
        """True when there are peers to talk to."""
        self.flat = _Flat(params)
        self.layout = layout_id(params)
        self.rank, self.size = api.rank(), api.size()
        if self.size == 1:
            return False
        self.net = getattr(api._state(), "peers", None)
        if self.net is None:
            raise api.BytePSError(
                f"{self.describe()} on worker rank {self.rank}: this worker has no peer "
                f"socket; decentralized algorithms need BYTEPS_ENABLE_PEERS=1 (the default) "
                f"on every worker")
        self.net.connect(r for r in range(self.size) if r != self.rank)
        self.slot = self.net.new_slot()
        return True

    def _due(self) -> bool:
        self.steps += 1
        return self.net is not None and self.steps % self.interval == 0

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """An exact average through the servers: every rank ends identical."""
        if self.size > 1:
            average_now(params, self.prefix + "final.")


class Decentralized(_PeerAlgorithm):
    """Average the model with peers after every ``communication_interval`` local steps.

    ``peer_selection``: ``"all"`` (every rank) or ``"shift_one"`` (one peer per step on a
    ring whose distance shifts every step).
    """

    def __init__(self, peer_selection: str = "all", communication_interval: int = 1):
        if peer_selection not in SELECTIONS:
            raise ValueError(f"peer_selection must be one of {SELECTIONS}, got "
                             f"{peer_selection!r}")
        super().__init__(communication_interval)
        self.selection = peer_selection

    def describe(self) -> str:
        return (f"Decentralized(peer_selection={self.selection!r}, "
                f"communication_interval={self.interval})")

    def init(self, params: dict[str, np.ndarray]) -> None:
        self._setup(params)

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        if not self._due():
            return
        t, self.comm = self.comm, self.comm + 1
        x = self.flat.gather(params)
        nb = x.nbytes
        what = f"{self.describe()} step {t}"
        if self.selection == "all":
            for r in range(self.size):
                if r != self.rank:
                    self.net.send(r, t, self.slot, KIND_RAW, self.layout, x)
            models = [x if r == self.rank else self._recv(r, t, nb, what)
                      for r in range(self.size)]
            acc = models[0].copy()
            for m in models[1:]:
                acc += m
            acc /= self.size
        else:
            to, frm = shift_one_peers(self.rank, self.size, t)
            self.net.send(to, t, self.slot, KIND_RAW, self.layout, x)
            other = self._recv(frm, t, nb, what)
            acc = (x + other) if self.rank < frm else (other + x)
            acc /= 2
        self.flat.scatter(acc, params)

    def _recv(self, rank: int, tag: int, nbytes: int, what: str) -> np.ndarray:
        buf = self.net.recv(rank, tag, self.slot, KIND_RAW, self.layout, nbytes, what)
        return np.frombuffer(buf, dtype=self.flat.dtype)


class LowPrecisionDecentralized(_PeerAlgorithm):
    """Ring decentralized SGD with 8-bit quantised model differences and error
    compensation (CHOCO-SGD; Bagua's ``low_precision_decentralized``).

    ``gamma``: consensus step size (0 < gamma <= 1); ``bucket``: elements per int8
    min/max bucket (byteps/compression/int8.py).
    """

    prefix = "LowPrecisionDecentralized."

    def __init__(self, communication_interval: int = 1, gamma: float = 1.0,
                 bucket: int = 1024):
        super().__init__(communication_interval)
        if not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        from byteps.compression import parse
        self.spec = parse({"compressor": "int8", "bucket": bucket})
        self.gamma = float(gamma)

    def describe(self) -> str:
        return (f"LowPrecisionDecentralized(communication_interval={self.interval}, "
                f"gamma={self.gamma:g})")

    def init(self, params: dict[str, np.ndarray]) -> None:
        if not self._setup(params):
            return
        # every rank starts from the same model, so replicas start equal everywhere
        average_now(params, self.prefix + "init.")
        from byteps.compression.int8 import Int8
        self.codec = Int8(self.spec, self.flat.n, 0, 0)
        self.nbrs = sorted({(self.rank - 1) % self.size, (self.rank + 1) % self.size}
                           - {self.rank})
        x = self.flat.gather(params).astype(np.float32)
        self.hat = {r: x.copy() for r in self.nbrs + [self.rank]}
        self.dec = np.empty(self.flat.n, np.float32)

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        if not self._due():
            return
        t, self.comm = self.comm, self.comm + 1
        what = f"{self.describe()} step {t}"
        x = self.flat.gather(params).astype(np.float32, copy=False)
        me = self.hat[self.rank]
        frame = self.codec.compress(x - me, t)
        for r in self.nbrs:
            self.net.send(r, t, self.slot, KIND_INT8, self.layout, frame)
        self.codec.decompress(frame, t, self.dec)
        me += self.dec
        for r in self.nbrs:
            buf = self.net.recv(r, t, self.slot, KIND_INT8, self.layout,
                                self.codec.frame_bytes, what)
            try:
                self.codec.decompress(buf, t, self.dec)
            except CompressionError as exc:
                raise api.BytePSError(f"worker rank {self.rank}: {what}: the frame of "
                                      f"{self.net.describe(r)} is invalid: {exc}") from None
            self.hat[r] += self.dec
        mix = np.zeros_like(x)
        for r in self.nbrs:
            mix += self.hat[r]
            mix -= me
        x = x + (self.gamma / (len(self.nbrs) + 1)) * mix
        self.flat.scatter(x, params)

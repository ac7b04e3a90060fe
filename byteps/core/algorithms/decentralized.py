"""Decentralized SGD (Bagua's ``decentralized`` and ``low_precision_decentralized``):
workers average their models with peers, worker to worker, without the servers.

The update rule (adapt, then combine), after every ``communication_interval`` local
optimizer steps, on the parameters ``x_i`` (communication steps ``t`` count from 0):

* ``peer_selection="all"``: ``x_i <- mean_j x_j`` over every rank; the sum runs in rank
  order on every rank, so every rank holds bit-identical parameters.
* ``"shift_one"``: distance ``d = 1 + t mod (n - 1)``; rank ``i`` sends its model to
  ``(i + d) mod n``, receives the model of ``p = (i - d) mod n`` and sets
  ``x_i <- (x_min(i,p) + x_max(i,p)) / 2`` (one message out and one in per step, every
  pair meets within ``n - 1`` steps, the mixing matrix is doubly stochastic).
* ``"ring"``: ``x_i <- mean of x_{i-1}, x_i, x_{i+1}`` (in rank order).

**With ``compression_params``** (any compressor of byteps.compression) the peers exchange
compressed *differences* (CHOCO-SGD): a rank keeps replicas of its own model as each
receiver knows it (``mine[j]``, one shared replica for the fixed topologies "all" and
"ring", one per peer for "shift_one") and of each sender's model (``theirs[j]``); it
sends ``q = C(x_i - mine[j])`` and adds the decoded ``q`` to ``mine[j]``, the receiver
adds it to its ``theirs[i]``, so both replicas stay identical.  Then
``x_i <- x_i + gamma * w * sum_j (theirs[j] - mine)`` with ``w = 1 / (peers + 1)``
("all", "ring") or ``x_i <- x_i + gamma / 2 * (theirs[p] - mine[to])`` ("shift_one";
the sum over ranks of the corrections is zero, so the mean of the models is kept).  What
the compressor dropped stays in ``x_i - mine[j]`` and goes out with the next step: the
error feedback is kept per peer.  :class:`LowPrecisionDecentralized` is the ring with int8.

**join()**: a rank that joined tells its peers (:meth:`PeerNet.announce_join`); they
treat it as absent (its parameters stay as they were; the others average without it:
every rank that waits for a message the joined rank never sent sees the same absence, so
"all" stays identical on the present ranks).  After every rank has joined, the first
step re-forms the group: one exact average through the servers, counters and replicas
restart together.

``finish()`` averages the models exactly through the servers, so every rank ends with
identical parameters.  Messages go through :mod:`byteps.core.algorithms.peers` (authenticated,
validated; a dead peer ends the wait with an error naming it).
"""
from __future__ import annotations

import hashlib

import numpy as np

from byteps.compression import CompressionError, compress_flagged, decompress_flagged
from byteps.core import api
from byteps.core.algorithms.base import Algorithm, _spec, average_now

KIND_RAW, KIND_COMP = 0, 1
KIND_INT8 = KIND_COMP              # the old name (int8 frames are compressed frames)
SELECTIONS = ("all", "shift_one", "ring")


def layout_id(params: dict[str, np.ndarray], extra: str = "") -> int:
    """63-bit fingerprint of the names, shapes and dtypes (peers must agree)."""
    h = hashlib.blake2b(digest_size=8)
    for n in sorted(params):
        h.update(f"{n}|{params[n].shape}|{params[n].dtype.str};".encode())
    if extra:
        h.update(extra.encode())
    return int.from_bytes(h.digest(), "little") >> 1


def shift_one_peers(rank: int, size: int, step: int) -> tuple[int, int]:
    """(send to, receive from) at communication step ``step``."""
    d = 1 + step % (size - 1)
    return (rank + d) % size, (rank - d) % size


def ring_peers(rank: int, size: int) -> list[int]:
    return sorted({(rank - 1) % size, (rank + 1) % size} - {rank})


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
    compresses = "parameter differences"

    def __init__(self, communication_interval: int):
        if type(communication_interval) is not int or communication_interval < 1:
            raise ValueError(f"communication_interval must be an int >= 1, got "
                             f"{communication_interval!r}")
        self.interval = communication_interval
        self.steps = 0            # local steps
        self.comm = 0             # communication steps (the message tags)
        self.net = None
        self.flat: _Flat | None = None
        self.rank, self.size = -1, 0          # set by init()
        self.joins = 0            # join() rounds this instance has re-formed after

    def _setup(self, params: dict[str, np.ndarray]) -> bool:
        """True when there are peers to talk to."""
        self.flat = _Flat(params)
        extra = _spec(self.compression_params).describe() if self.compression_params else ""
        self.layout = layout_id(params, extra)
        self.rank, self.size = api.rank(), api.size()
        self.group = api._state()     # this group's state; another one: _regroup()
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
        self.joins = self.net.join_gen
        return True

    def _due(self, params: dict[str, np.ndarray]) -> bool:
        if getattr(self, "group", None) is not api._state():   # elastic re-form, init() again
            self._regroup(params)
        self.steps += 1
        if self.net is None:
            return False
        if self.net.join_gen != self.joins:        # every rank joined since the last step
            self._reform(params)
        return self.steps % self.interval == 0

    def _reform(self, params: dict[str, np.ndarray]) -> None:
        """After join(): every rank re-forms at its next step (a collective): one exact
        average, and message tags that continue after every rank's last one."""
        self.joins = self.net.join_gen
        tag = f"{self.prefix}rejoin{self.joins}."
        average_now(params, tag)
        total = api.push_pull(np.array([self.comm], np.int64), tag + "comm", average=False)
        self.comm = int(total[0]) + 1
        self._restart(params)

    def _regroup(self, params: dict[str, np.ndarray]) -> None:
        """A new group (``bps.elastic.run`` re-formed it: a new epoch, dense ranks, the
        peers of the new address book): steps and message tags count from 0 on every
        member (a newcomer's too) and replicas start from the parameters, which
        ``state.sync()`` made identical on every rank."""
        slot = getattr(self, "slot", None)
        self.steps = self.comm = 0
        self.net = None
        if not self._setup(params):
            return
        if slot is not None:
            self.slot = self.net.keep_slot(slot)
        self._restart(params)

    def _restart(self, params: dict[str, np.ndarray]) -> None:
        """Replicas start again from the (identical) parameters."""

    def _recv(self, rank: int, tag: int, nbytes: int, kind: int, what: str):
        """The payload of ``rank`` for step ``tag``; None when ``rank`` joined without
        sending it."""
        return self.net.recv(rank, tag, self.slot, kind, self.layout, nbytes, what,
                             absent_ok=True)

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """An exact average through the servers: every rank ends identical."""
        if api.size() > 1:                  # (the current group's: elastic re-forms)
            average_now(params, self.prefix + "final.")


class Decentralized(_PeerAlgorithm):
    """Average the model with peers after every ``communication_interval`` local steps.

    ``peer_selection``: ``"all"`` (every rank), ``"shift_one"`` (one peer per step on a
    ring whose distance shifts every step) or ``"ring"`` (both ring neighbours).
    ``compression_params``: compress the exchanged differences (module docstring);
    ``gamma`` (0 < gamma <= 1): the consensus step size of compressed exchanges.
    """

    def __init__(self, peer_selection: str = "all", communication_interval: int = 1,
                 compression_params=None, gamma: float = 1.0):
        if peer_selection not in SELECTIONS:
            raise ValueError(f"peer_selection must be one of {SELECTIONS}, got "
                             f"{peer_selection!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) \
                or not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        super().__init__(communication_interval)
        self.selection = peer_selection
        self.gamma = float(gamma)
        self._set_compression(compression_params)

    def describe(self) -> str:
        return (f"Decentralized(peer_selection={self.selection!r}, "
                f"communication_interval={self.interval}{self._compressed()})")

    # ------------------------------------------------------------------ topology
    def _peers(self, t: int) -> tuple[list[int], list[int]]:
        """(send to, receive from) at communication step ``t``."""
        if self.selection == "all":
            others = [r for r in range(self.size) if r != self.rank]
            return others, others
        if self.selection == "ring":
            nb = ring_peers(self.rank, self.size)
            return nb, nb
        to, frm = shift_one_peers(self.rank, self.size, t)
        return [to], [frm]

    def init(self, params: dict[str, np.ndarray]) -> None:
        if not self._setup(params) or not self.compression_params:
            return
        if api._state().book.get("elastic_gen"):
            # joined a re-formed elastic group: the members average nothing now, and the
            # state is synced from rank 0 before the first step (_regroup() then)
            self.group = None
            return
        # every rank starts from the same model, so replicas start equal everywhere
        average_now(params, self.prefix + "init.")
        self._restart(params)

    def _restart(self, params: dict[str, np.ndarray]) -> None:
        if not self.compression_params:
            return
        if getattr(self, "codec", None) is None or self.codec_n != self.flat.n:
            from byteps.compression.pipeline import REGISTRY
            spec = _spec(self.compression_params)
            self.codec, self.codec_n = REGISTRY[spec.compressor](spec, self.flat.n, 0, 0), \
                self.flat.n
            self.dec = np.empty(self.flat.n, np.float32)
        x = self.flat.gather(params).astype(np.float32)
        others = [r for r in range(self.size) if r != self.rank]
        if self.selection == "shift_one":
            self.mine = {r: x.copy() for r in others}
        else:
            own = x.copy()                   # one replica: every receiver gets each frame
            self.mine = {r: own for r in others}
        srcs = ring_peers(self.rank, self.size) if self.selection == "ring" else others
        self.theirs = {r: x.copy() for r in srcs}

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        if not self._due(params):
            return
        t, self.comm = self.comm, self.comm + 1
        what = f"{self.describe()} step {t}"
        if self.compression_params:
            self._compressed_step(params, t, what)
        else:
            self._raw_step(params, t, what)

    def _raw_step(self, params, t: int, what: str) -> None:
        x = self.flat.gather(params)
        to, frm = self._peers(t)
        for r in to:
            if r not in self.net.joined:
                self.net.send(r, t, self.slot, KIND_RAW, self.layout, x)
        got = {r: self._recv(r, t, x.nbytes, KIND_RAW, what) for r in frm}
        models = []                       # rank order; a rank that joined is absent
        for r in sorted(set(frm) | {self.rank}):
            if r == self.rank:
                models.append(x)
            elif got[r] is not None:
                models.append(np.frombuffer(got[r], dtype=self.flat.dtype))
        if len(models) == 1:
            return
        acc = models[0].copy()
        for m in models[1:]:
            acc += m
        acc /= len(models)
        self.flat.scatter(acc, params)

    def _compressed_step(self, params, t: int, what: str) -> None:
        x = self.flat.gather(params).astype(np.float32, copy=False)
        to, frm = self._peers(t)
        frames: dict[int, np.ndarray] = {}
        for r in to:
            h = self.mine[r]
            f = frames.get(id(h))
            if f is None:                    # a shared replica is updated once
                # a status byte follows the frame (inf or NaN: both replicas take NaN)
                f = frames[id(h)] = compress_flagged(self.codec, x - h, t)
                decompress_flagged(self.codec, f, t, self.dec)
                h += self.dec
            if r not in self.net.joined:
                self.net.send(r, t, self.slot, KIND_COMP, self.layout, f)
        present = []
        for r in frm:
            buf = self._recv(r, t, self.codec.frame_bytes + 1, KIND_COMP, what)
            if buf is None:
                continue
            try:
                decompress_flagged(self.codec, buf, t, self.dec)
            except CompressionError as exc:
                raise api.BytePSError(f"worker rank {self.rank}: {what}: the frame of "
                                      f"{self.net.describe(r)} is invalid: {exc}") from None
            self.theirs[r] += self.dec
            present.append(r)
        if not present:
            return
        if self.selection == "shift_one":
            x = x + np.float32(self.gamma / 2) * (self.theirs[present[0]] - self.mine[to[0]])
        else:
            me = self.mine[to[0]]
            mix = np.zeros_like(x)
            for r in present:
                mix += self.theirs[r]
                mix -= me
            x = x + (self.gamma / (len(present) + 1)) * mix
        self.flat.scatter(x, params)


class LowPrecisionDecentralized(Decentralized):
    """Ring decentralized SGD with 8-bit quantised model differences and error
    compensation (CHOCO-SGD; Bagua's ``low_precision_decentralized``): the same as
    ``Decentralized(peer_selection="ring", compression_params={"compressor": "int8",
    "bucket": bucket}, gamma=gamma)``.

    ``gamma``: consensus step size (0 < gamma <= 1); ``bucket``: elements per int8
    min/max bucket (byteps/compression/int8.py).
    """

    prefix = "LowPrecisionDecentralized."

    def __init__(self, communication_interval: int = 1, gamma: float = 1.0,
                 bucket: int = 1024):
        super().__init__("ring", communication_interval,
                         {"compressor": "int8", "bucket": bucket}, gamma)

    def describe(self) -> str:
        return (f"LowPrecisionDecentralized(communication_interval={self.interval}, "
                f"gamma={self.gamma:g})")

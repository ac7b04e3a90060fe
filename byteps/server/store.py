"""Per-partition state of the summation server (no sockets here).

Sync mode: each round of a key sums one push from every worker; pulls of the
round wait until it is complete; the round is dropped once every worker has
pulled it.  Async mode: a push is added to the stored value at once and a
pull returns a copy of the current value.  A push from a rank that already
pushed the round (a resend) is never summed twice.

Compressed partitions (``slot.pipe``, byteps.compression): the caller decompresses
each push into float32 (:meth:`Slot.unpack`); the round is summed in float32 and
the finished sum is compressed once (server-side error feedback lives in the
pipeline), so every worker pulls the same compressed frame.  A NONFINITE push (the
partition held inf or NaN, which no compressor encodes) counts as a push of NaN: the
round's result is NONFINITE for every worker, an empty frame they read as NaN.

Ranks that called ``join()`` (out of data) count as having pushed zeros: a round
completes when every other pusher is in, with no frame from them (docs/fault_tolerance.md).
"""
from __future__ import annotations

import time

import numpy as np

from byteps.server.tree import (WRITABLE, Nodes, Pool, accumulator, add, collapse, position,
                                 release, take)
from byteps.transport.wire import (AVG, COMP, DTYPES, NONFINITE, PULL, PUSH, SHM, Entry,
                                   average)

# the declared reduction (wire.REDUCE_OPS order: sum, min, max, product)
REDUCE = (np.add, np.minimum, np.maximum, np.multiply)


class Round(Nodes):
    """One round of a synchronous key: its reduction tree (the pushes and partial sums,
    :class:`byteps.server.tree.Nodes`) and who pushed, pulled and waits."""
    __slots__ = ("ranks", "result", "waiting", "pulled", "started", "warned", "div",
                 "nonfinite")

    def __init__(self):
        Nodes.__init__(self)
        self.div = 0          # > 0: every push asked for the average, divide by this (AVG)
        self.nonfinite = False    # a push was NONFINITE: the result is (wire.NONFINITE)
        self.ranks: set[int] = set()
        self.result = None
        self.waiting: list = []
        self.pulled: set[int] = set()
        self.started = time.monotonic()
        self.warned = False


class Slot:
    """One partition (key, part) stored on this server."""
    __slots__ = ("key", "part", "dtype", "length", "rounds", "value", "engine", "pushes",
                 "bytes_in", "bufs", "segs", "applied", "pipe", "scratch", "reduce", "outer",
                 "frames", "pool")

    def __init__(self, key: int, part: int, dtype: int, length: int, engine: int, pipe=None,
                 op: int = 0):
        self.key, self.part, self.dtype, self.length = key, part, dtype, length
        self.rounds: dict[int, Round] = {}
        self.value = None
        self.engine = engine
        self.pushes = 0
        self.bytes_in = 0
        self.bufs = None      # two result arrays, double-buffered by round parity
        self.segs = None      # their shared-memory segments (colocated workers)
        self.frames = None    # [(buf, zmq.Frame)]: bufs' zero-copy frames (server/replies.py)
        self.applied: dict[int, int] = {}   # async: rank -> last round applied (dedup)
        self.pipe = pipe      # server-side compression pipeline (None: raw payloads)
        self.scratch = None
        self.reduce = REDUCE[op]    # element-wise reduction of a round (declared op)
        self.outer = None     # DiLoCo's outer optimizer (byteps.server.outer.Outer)
        self.pool = Pool(length, accumulator(DTYPES[dtype], self.reduce, pipe is not None))

    def result_buf(self, rnd: int) -> np.ndarray:
        """Round ``rnd``'s result buffer (double-buffered by round parity: round r+2
        starts only after every worker received round r, so reuse is safe)."""
        if self.bufs is None:
            dt = np.float32 if self.pipe is not None else DTYPES[self.dtype]
            self.bufs = [np.empty(self.length, dt) for _ in (0, 1)]
        return self.bufs[rnd % 2]

    def unpack(self, buf, rnd: int, into: np.ndarray | None = None,
               nonfinite: int = 0) -> np.ndarray:
        """Decompress a push into ``into`` or this slot's float32 scratch array (raises
        CompressionError for a malformed frame, before writing anything else).  The
        scratch is valid until the next unpack.  ``nonfinite`` (wire.NONFINITE): the
        partition held inf or NaN (an empty frame), a push of NaN."""
        if into is None:
            if self.scratch is None:
                self.scratch = np.empty(self.length, np.float32)
            into = self.scratch
        if nonfinite:
            into.fill(np.nan)
        else:
            self.pipe.decompress(buf, rnd, into)
        return into

    def reset_rounds(self) -> None:
        self.rounds.clear()
        self.applied.clear()
        if self.outer is not None:
            self.outer.reset()


def full(rs: Round, nworkers: int, joined: frozenset) -> bool:
    """Every pusher is in: pushed, or joined (``join()``: counted as a zero contribution,
    no frame needed, so compressed tensors need nothing special)."""
    return len(rs.ranks) + len(joined - rs.ranks) >= nworkers


def counted_joined(joined, workers, local_reduce: str) -> frozenset:
    """The ranks a round counts as having pushed zeros.  Without local reduction: the
    ranks that called ``join()``.  With it a host pushes once per key (its local root, or
    one local rank per slice), and a joined local rank only adds zeros to its host's
    local sum: a host counts as joined once every one of its local ranks has, by one rank
    (its local root), so that one host never counts twice."""
    joined = frozenset(joined)
    if local_reduce == "off" or not joined:
        return joined
    hosts: dict = {}
    for w in workers:
        hosts.setdefault(w["host_id"], []).append(w)
    return frozenset(min(ws, key=lambda w: w["local_rank"])["rank"] for ws in hosts.values()
                     if all(w["rank"] in joined for w in ws))


def async_groups(workers, local_reduce: str, joined, gone) -> dict:
    """Who bounds the staleness of asynchronous keys: ``{group: ranks}`` of the groups
    still pushing (not joined, not gone); a group's round on a partition is the newest any
    of its ranks pushed.  Without local reduction every rank is its own group; with it a
    host is one (its local root, or its local rank of a slice, pushes for it), so the
    bound applies per host (byteps.server.staleness)."""
    out: dict = {}
    for w in workers:
        r = w["rank"]
        if r in gone:
            continue
        g = r if local_reduce == "off" else w["host_id"]
        out.setdefault(g, [[], False])
        out[g][0].append(r)
        out[g][1] |= r not in joined
    return {g: rs for g, (rs, active) in out.items() if active}


ROUNDS_DONE = [0]     # rounds finished by this process (byteps.server.metrics)
NONFINITE_RESULT = np.empty(0, np.uint8)     # the frame of a NONFINITE result


def _flags(e: Entry, flags: int) -> Entry:
    """``e`` with other flags (``Entry._replace`` costs several times more per partition)."""
    return Entry(e.key, e.part, e.round, flags, e.dtype, e.length)


def finish(slot: Slot, rnd: int, rs: Round, out: dict) -> None:
    """The round's pushes are all in: reduce what is left of its tree (byteps.server.tree)
    into the result buffer, compress it once (compressed tensors) and answer the pulls
    that wait."""
    dst = slot.result_buf(rnd)
    acc, owned = collapse(rs, slot.reduce, slot.pool, dst)
    if slot.pipe is not None:       # NaN has no compressed form: an empty NONFINITE frame
        rs.result = NONFINITE_RESULT if rs.nonfinite else slot.pipe.compress(acc, rnd)
        release(rs, slot.pool, dst, acc)
    elif owned is True or rs.div or slot.segs:
        # owned: the result buffer unless the root was complete before the round was (a
        # join); a single pusher: into the result buffer with AVG or shared-memory results
        src = acc
        if rs.div and acc.dtype != dst.dtype:      # float16 summed in float32: round first
            np.copyto(dst, acc, casting="same_kind")
            src = dst
        if rs.div:            # the workers' own rule (wire.average) on the rounded sum
            average(src, rs.div, dst)
        elif acc is not dst:
            np.copyto(dst, acc, casting="same_kind")
        if owned is True:
            release(rs, slot.pool, dst, acc)
        rs.result = dst
    else:
        rs.result = acc       # a single pusher, zero copy
    rs.result_used = False
    ROUNDS_DONE[0] += 1
    for w_ident, w_rank, w_entry in rs.waiting:
        if rs.div or rs.nonfinite:
            w_entry = _flags(w_entry, w_entry.flags | (AVG if rs.div else NONFINITE))
        out.setdefault(w_ident, []).append((w_entry, rs.result))
        rs.pulled.add(w_rank)
    rs.waiting.clear()


def recheck(slot: Slot, nworkers: int, joined: frozenset, out: dict) -> int:
    """Finish the rounds that a newly joined rank was the last one missing from; returns
    how many."""
    done = 0
    for rnd, rs in list(slot.rounds.items()):
        if rs.result is None and rs.ranks and full(rs, nworkers, joined):
            finish(slot, rnd, rs, out)
            done += 1
    return done


def apply(slot: Slot, entry: Entry, arr, rank: int, ident: bytes, nworkers: int,
          out: dict, joined: frozenset = frozenset(), size: int = 0,
          leaf: int | None = None, writable: bool = False) -> None:
    """Apply one entry (push and/or pull) of a synchronous key from ``rank``; queue
    replies into ``out`` (asynchronous keys: byteps.server.staleness.AsyncStore).

    ``out`` maps a worker identity to a list of (entry, array-or-None).  Pushes are
    acknowledged by the caller on receipt (that releases the worker's credit).
    ``joined``: ranks that called ``join()``; they count as having pushed zeros.
    ``size``: the job's ranks, when this server may average (0: never); a round whose
    every push carries AVG (float, uncompressed) is divided here and its results carry
    AVG, so the workers copy instead of dividing.
    ``leaf``: the pusher's position in the reduction tree (byteps.server.tree; None: the
    rank).  ``writable``: an uncompressed push is this server's own copy (a socket frame),
    which partial sums may overwrite (tree.WRITABLE).  A compressed push (``arr`` is its frame) is decompressed into a float32
    buffer, or into scratch when its sibling is there to take it at once; a malformed
    frame raises CompressionError before the round changes.
    """
    rnd, flags, dt, length = entry.round, entry.flags, entry.dtype, entry.length
    rs = slot.rounds.get(rnd)
    if rs is None:
        rs = slot.rounds[rnd] = Round()
    if flags & PUSH:
        if rank not in rs.ranks and rs.result is None:
            nbytes = arr.nbytes
            t = rs                         # the round's tree (a tree.Nodes)
            pos = position(t, leaf, rank)
            # the result buffer serves partial sums too (none needed yet: left lazy)
            result = slot.result_buf(rnd) if t.nodes or slot.pipe is not None else None
            owned = WRITABLE if writable and arr.dtype == slot.pool.dtype and \
                arr.flags.writeable else False
            # this push completes the round (then the tree is collapsed into the result)
            last = full(rs, nworkers - 1, joined - {rank}) if joined else \
                len(rs.ranks) + 1 >= nworkers
            if slot.pipe is not None:                      # arr is a compressed frame
                nbytes = length * 4
                nonfinite = flags & NONFINITE              # inf or NaN: a push of NaN
                rs.nonfinite |= bool(nonfinite)
                if (0, pos ^ 1) in t.nodes and t.nodes[(0, pos ^ 1)][1]:
                    arr = slot.unpack(arr, rnd, nonfinite=nonfinite)   # combined at once
                else:
                    buf = take(t, slot.pool, result)
                    try:
                        arr, owned = slot.unpack(arr, rnd, buf, nonfinite), True
                    except Exception:
                        release(t, slot.pool, result, buf)
                        raise
            add(t, pos, arr, owned, slot.reduce, slot.pool, result, cascade=not last)
            if not rs.ranks:
                rs.div = size if size > 1 and flags & AVG and slot.pipe is None and \
                    DTYPES[dt].kind == "f" else 0
            elif not flags & AVG:
                rs.div = 0
            rs.ranks.add(rank)
            slot.pushes += 1
            slot.bytes_in += nbytes
            if full(rs, nworkers, joined):
                finish(slot, rnd, rs, out)
    if flags & PULL:
        rflags = PULL | COMP if slot.pipe is not None else \
            PULL | (flags & SHM if slot.segs else 0)
        if rs.result is not None and rs.div:
            rflags |= AVG
        if rs.result is not None and rs.nonfinite:
            rflags |= NONFINITE
        reply = Entry(entry.key, entry.part, rnd, rflags, dt, length)
        if rs.result is not None:
            if rank not in rs.pulled:
                rs.pulled.add(rank)
            out.setdefault(ident, []).append((reply, rs.result))
        elif not any(w[1] == rank for w in rs.waiting):
            rs.waiting.append((ident, rank, reply))
    if rs.result is not None and len(rs.pulled | joined) >= nworkers:
        # keep this finished round for resent pulls; drop older finished rounds
        for old in [r for r, st in slot.rounds.items() if r < rnd and st.result is not None
                    and len(st.pulled | joined) >= nworkers]:
            del slot.rounds[old]

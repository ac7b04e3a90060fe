"""Asynchronous keys on the server, with optional bounded staleness (no sockets here).

An entry flagged ``wire.ASYNC`` (a worker with ``BYTEPS_ENABLE_ASYNC=1`` pushing a
parameter delta, docs/algorithms.md) is applied at once: the push is added to the
stored value and the pull answers the current value, as in the original BytePS.

Bounded staleness (``BYTEPS_ASYNC_STALENESS=s``): the pull of round ``r`` from a rank
is held while ``r - s`` exceeds the round of the slowest rank (the smallest round every
pushing rank has reached on this partition), and answered as soon as that rank pushes
round ``r - s``.  So no worker runs more than ``s`` steps ahead of the slowest one:
``s = 0`` is synchronous (every pull of round ``r`` sees exactly the pushes of rounds
``<= r`` of every rank), unset is unbounded.  Ranks that called ``join()`` or left do
not hold anyone back.  With local reduction a host pushes once per key (its local
root), so the bound holds per host (:func:`byteps.server.store.async_groups`).

Compressed asynchronous keys (AsyncPS with ``compression_params``): each push is a
compressed delta (``COMP | ASYNC``, its frame validated like a synchronous one), which
the server decompresses into float32 and adds at once; a raw push of the same key
(``ASYNC`` alone: AsyncPS's exact seed and its pulls' zeros) is added as it is; the pull
always answers the full-precision value, uncompressed (parameters, never deltas).

Keys with an outer optimizer (DiLoCo, :mod:`byteps.server.outer`) are asynchronous keys
with a bound of 0 whose pushes are summed per round (in a fixed order, as synchronous
rounds) and applied as one outer step.

``stats`` counts what happened (``max_lag``: the largest ``r - slowest`` ever answered),
written by the server to ``<BYTEPS_TEST_RECORD>.staleness.<pid>.json`` for the tests.
"""
from __future__ import annotations

import time

import numpy as np

from byteps.transport.wire import DTYPES, PULL, PUSH, Entry


class AsyncStore:
    """The asynchronous state of one server: held pulls per partition and counters."""

    def __init__(self, staleness: int | None):
        self.staleness = staleness
        self.held: dict[tuple, list] = {}     # (key, part) -> [(ident, rank, rnd, reply, t0)]
        self.stats = {"staleness": staleness, "pushes": 0, "pulls": 0, "held": 0,
                      "max_lag": 0, "max_held_s": 0.0}
        self.reported = None        # the last stall report (tensor, slow ranks, round)

    def slowest(self, slot, ranks) -> tuple[int, list]:
        """The smallest round pushed on ``slot`` by any group of ``ranks`` (-1: one has
        not pushed yet) and the ranks of the groups at that round.  ``ranks``: a set of
        ranks (each its own group), or ``{group: ranks}`` (byteps.server.store.async_groups:
        with local reduction a host is one group, whichever of its ranks pushes)."""
        groups = ranks if isinstance(ranks, dict) else {r: (r,) for r in ranks}
        rounds = {g: max(slot.applied.get(r, -1) for r in rs) for g, rs in groups.items()}
        if not rounds:
            return 1 << 62, []
        low = min(rounds.values())
        return low, sorted(r for g, v in rounds.items() if v == low for r in groups[g])

    def apply(self, slot, entry: Entry, arr, rank: int, ident: bytes, ranks, out: dict,
              leaf: int | None = None) -> None:
        """Apply one asynchronous entry from ``rank``; queue replies into ``out``.

        ``arr``: the pushed delta, float32 already when it came compressed (the server
        decompressed it with the slot's pipeline), raw elements otherwise (an exact push:
        AsyncPS's seed, or zeros); it is added to the key's full-precision value at once,
        and the pull answers that value uncompressed.
        ``ranks``: who still pushes (not joined, not gone): a set of ranks or
        ``{group: ranks}`` (see :meth:`slowest`).  ``leaf``: the rank's position in the
        fixed summation tree of an outer key's round (byteps.server.tree; None: the rank)."""
        rnd, flags = entry.round, entry.flags
        if flags & PUSH and slot.applied.get(rank, -1) < rnd:     # a resend is not re-added
            slot.applied[rank] = rnd
            if slot.outer is not None:          # DiLoCo: summed, stepped when complete
                slot.outer.add(slot, arr, entry.length, entry.dtype, rank, leaf)
            else:
                if slot.value is None:
                    slot.value = np.zeros(entry.length, dtype=DTYPES[entry.dtype])
                np.add(slot.value, arr, out=slot.value)
            slot.pushes += 1
            slot.bytes_in += arr.nbytes
            self.stats["pushes"] += 1
        if flags & PULL:
            reply = entry._replace(flags=PULL)
            held = self.held.setdefault((entry.key, entry.part), [])
            held[:] = [h for h in held if (h[1], h[2]) != (rank, rnd)]   # a resent pull
            held.append((ident, rank, rnd, reply, time.monotonic()))
        self.release(slot, ranks, out)

    def release(self, slot, ranks, out: dict) -> None:
        """Answer the held pulls of ``slot`` that the bound allows now."""
        held = self.held.get((slot.key, slot.part))
        if slot.outer is not None:           # DiLoCo (server/outer.py): bound 0, step first
            low, _ = self.slowest(slot, ranks)
            slot.outer.advance(slot, low)
            bound = 0
        elif not held:
            return
        else:
            low, _ = self.slowest(slot, ranks)
            bound = self.staleness
        if not held:
            return
        keep = []
        now = time.monotonic()
        for h in held:
            ident, rank, rnd, reply, t0 = h
            if bound is not None and rnd - bound > low:
                keep.append(h)
                continue
            val = slot.value if slot.value is not None else np.zeros(reply.length,
                                                                     DTYPES[reply.dtype])
            out.setdefault(ident, []).append((reply, val.copy()))
            st = self.stats
            st["pulls"] += 1
            if now - t0 > 1e-3:
                st["held"] += 1
                st["max_held_s"] = max(st["max_held_s"], round(now - t0, 3))
            st["max_lag"] = max(st["max_lag"], rnd - min(low, rnd))
        held[:] = keep

    def waiting(self, slots: dict, ranks, older_than: float, now: float) -> list:
        """Held pulls older than ``older_than`` seconds: ``(key, part, rank, rnd, age,
        slowest round, slow ranks)`` for the stall inspector."""
        found = []
        for (key, part), held in list(self.held.items()):
            slot = slots.get((key, part))
            if slot is None or not held:
                continue
            low, slow = self.slowest(slot, ranks)
            for _, rank, rnd, _, t0 in list(held):
                if now - t0 >= older_than:
                    found.append((key, part, rank, rnd, now - t0, low, slow))
        return found

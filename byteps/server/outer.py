"""Keys whose server runs DiLoCo's outer optimizer (a declaration with the ``outer`` field,
``wire.outer_field``; docs/algorithms.md).

Such a key is asynchronous on the wire (``wire.ASYNC``: compressed pushes, full-precision
pulls, exact raw seeds, byteps/server/staleness.py) with a staleness bound of 0: the
pull of round ``r`` waits until every rank still pushing (not joined, not gone; with
local reduction, every host) has pushed round ``r``.  What the pushes carry is the
weighted outer gradient (the worker scales its own by its share of the round's weight, so
their sum is the average over the ranks that contributed); the server sums them along the
same fixed binary tree over the pushers' positions as a synchronous round
(:mod:`byteps.server.tree`: the rank, or with local reduction the host), so the sum's bits
do not depend on the order the pushes arrive in; float16 (and compressed) outer gradients
are accumulated in float32 and rounded once.  When a round is complete the server applies
one outer step (:func:`byteps.common.outer.outer_step`) to the global parameters it holds
(``slot.value``) and the momentum (:attr:`Outer.m`); every pull of the round answers the
new global parameters.  Partial sums, the rounded sum and the step's work array are
buffers reused round after round (nothing allocated per round in steady state).

The first round after every reset of the rounds (the key's first use, a new membership
epoch, every rank joined) is a *seed*: when the server holds no parameters yet, the sum
(rank 0's parameters plus the others' zeros) becomes them; otherwise the pushes are
dropped and the pulls answer the parameters held, so a worker that joins the job (or a
re-formed group) starts from the global parameters and the momentum survives.
With ``BYTEPS_SERVER_REPLICAS=1`` the backup receives every push (as for any
asynchronous key) and runs the same steps on its own copy.
"""
from __future__ import annotations

import numpy as np

from byteps.common.outer import outer_step
from byteps.server.tree import (Nodes, Pool, accumulator, add, collapse, position, release,
                                 take)
from byteps.transport.wire import DTYPES


class Outer:
    """The outer optimizer of one partition: settings, momentum, this round's sum."""
    __slots__ = ("done", "g", "lr", "m", "momentum", "nesterov", "pool", "seeded", "steps",
                 "tree", "work")

    def __init__(self, lr: float, momentum: float, nesterov: bool):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.m = None          # momentum (the parameters' dtype)
        self.tree = Nodes()    # this round's pushes and partial sums (server/tree.py)
        self.pool = None       # buffers for partial sums (accumulator dtype), reused
        self.g = None          # the round's sum in the pushed dtype (rounded once), reused
        self.work = None       # outer_step's work array, reused
        self.done = -1         # the last round applied (since the last reset)
        self.seeded = False    # the seed round since the last reset is done
        self.steps = 0         # outer steps applied (records, tests)

    def reset(self) -> None:
        """The rounds restart at 0 (new epoch, every rank joined): a seed round first."""
        self._clear()
        self.done, self.seeded = -1, False

    def _clear(self) -> None:
        """Forget this round's tree; its buffers go back to the pool."""
        t = self.tree
        for arr, owned in t.nodes.values():
            if owned is True:           # a pool buffer, or the sum buffer
                release(t, self.pool, self.g, arr)
        t.nodes.clear()
        t.leaves.clear()
        t.result_used = False

    def add(self, slot, arr: np.ndarray, length: int, dtype: int, rank: int,
            leaf: int | None = None) -> None:
        """A push of the current round from ``rank`` at tree position ``leaf`` (None: the
        rank); float32 already when it came compressed (then ``arr`` may be the slot's
        decompression scratch, which the next push overwrites: kept as a copy unless its
        sibling is there to take it at once)."""
        t = self.tree
        if self.pool is None:
            dt = DTYPES[dtype]
            acc = np.promote_types(accumulator(dt, np.add, slot.pipe is not None), dt)
            self.pool, self.g = Pool(length, acc), np.empty(length, dt)
        pos = position(t, leaf, rank)
        owned = False
        if arr is slot.scratch and (0, pos ^ 1) not in t.nodes:
            buf = take(t, self.pool, self.g)
            np.copyto(buf, arr, casting="same_kind")
            arr, owned = buf, True
        add(t, pos, arr, owned, np.add, self.pool, self.g)

    def _sum(self):
        """Collapse the round's tree: ``(sum in the pushed dtype, owned buffer or None)``,
        ``(None, None)`` when nobody pushed."""
        if not self.tree.nodes:
            return None, None
        root, owned = collapse(self.tree, np.add, self.pool, self.g)
        if root.dtype != self.g.dtype:      # summed in float32, complete before the end
            np.copyto(self.g, root, casting="same_kind")
            return self.g, root if owned is True else None
        return root, root if owned is True else None

    def advance(self, slot, low: int) -> None:
        """Every pushing rank has reached round ``low``: apply the rounds not applied yet
        (at most one: a rank pushes round r + 1 only after it pulled round r)."""
        if low <= self.done or low >= 1 << 62:      # nothing new (or nobody pushes)
            return
        self.done = low
        g, held = self._sum()
        try:
            if not self.seeded:
                self.seeded = True
                if slot.value is None and g is not None:
                    slot.value = g.copy()           # once per reset: g is reused
                return
            if g is None or slot.value is None:     # every contributor joined: no change
                return
            if self.m is None:
                self.m = np.zeros_like(slot.value)
                self.work = np.empty_like(slot.value)
            outer_step(slot.value, self.m, g.astype(slot.value.dtype, copy=False), self.lr,
                       self.momentum, self.nesterov, self.work)
            self.steps += 1
        finally:
            if held is not None:
                release(self.tree, self.pool, self.g, held)
            self._clear()

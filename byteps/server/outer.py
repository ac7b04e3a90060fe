"""Keys whose server runs DiLoCo's outer optimizer (a declaration with the ``outer`` field,
``wire.outer_field``; docs/algorithms.md).

Such a key is asynchronous on the wire (``wire.ASYNC``: compressed pushes, full-precision
pulls, exact raw seeds, byteps/server/staleness.py) with a staleness bound of 0: the
pull of round ``r`` waits until every rank still pushing (not joined, not gone; with
local reduction, every host) has pushed round ``r``.  What the pushes carry is the
weighted outer gradient (the worker scales its own by its share of the round's weight, so
their sum is the average over the ranks that contributed); the server sums them in
:attr:`Outer.acc`, and when a round is complete applies one outer step
(:func:`byteps.common.outer.outer_step`) to the global parameters it holds
(``slot.value``) and the momentum (:attr:`Outer.m`); every pull of the round answers the
new global parameters.

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
from byteps.transport.wire import DTYPES


class Outer:
    """The outer optimizer of one partition: settings, momentum, this round's sum."""
    __slots__ = ("acc", "done", "lr", "m", "momentum", "nesterov", "seeded", "steps")

    def __init__(self, lr: float, momentum: float, nesterov: bool):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.m = None          # momentum (the parameters' dtype)
        self.acc = None        # this round's sum of pushes
        self.done = -1         # the last round applied (since the last reset)
        self.seeded = False    # the seed round since the last reset is done
        self.steps = 0         # outer steps applied (records, tests)

    def reset(self) -> None:
        """The rounds restart at 0 (new epoch, every rank joined): a seed round first."""
        self.acc, self.done, self.seeded = None, -1, False

    def add(self, slot, arr: np.ndarray, length: int, dtype: int) -> None:
        """A push of the current round (float32 already when it came compressed)."""
        if self.acc is None:
            self.acc = np.zeros(length, DTYPES[dtype])
        np.add(self.acc, arr, out=self.acc, casting="unsafe")

    def advance(self, slot, low: int) -> None:
        """Every pushing rank has reached round ``low``: apply the rounds not applied yet
        (at most one: a rank pushes round r + 1 only after it pulled round r)."""
        if low <= self.done or low >= 1 << 62:      # nothing new (or nobody pushes)
            return
        self.done = low
        acc, self.acc = self.acc, None
        if not self.seeded:
            self.seeded = True
            if slot.value is None and acc is not None:
                slot.value = acc
            return
        if acc is None or slot.value is None:       # every contributor joined: no change
            return
        if self.m is None:
            self.m = np.zeros_like(slot.value)
        outer_step(slot.value, self.m, acc.astype(slot.value.dtype, copy=False), self.lr,
                   self.momentum, self.nesterov)
        self.steps += 1

"""Autotune's step at an inferred step end (byteps/core/autotune/names.py), off the
user's thread (docs/scaling.md, "Autotune").

At a marked step end (``step_done()``) every rank stands at the same point of its
program, so autotune's exchanges there (one push_pull summed over the ranks) cannot wait
forever.  An inferred step end lies inside a push_pull: one rank may reach it before a
barrier that another rank passes first.  So there the tuner's step runs on a helper
thread (:func:`start`): its exchange is in flight while this rank goes on, and the
settings it decides are held back (``Tuner.queue``) until the next step end, where
:func:`settle` waits for the thread and applies them, on every rank at the same step.
By then every rank has passed the previous step end and pushed its part of the
exchange: this rank's whole step (every handle synchronized, ``names.NameSteps``) needed
the other ranks' pushes of that step, which all come after their step end.  The step
that ran before the new settings applied is not measured (``Tuner.discard``).
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("byteps.autotune")


def start(tu, n: int, exchange) -> None:
    """Run ``tu.at_step(n, exchange)`` on a helper thread, its settings queued."""
    tu.queue, tu.failed = [], None

    def run():
        try:
            tu.at_step(n, exchange)
        except BaseException as exc:      # noqa: BLE001 - reported by settle()
            tu.failed = exc
    th = threading.Thread(target=run, name="bps-autotune-step", daemon=True)
    tu.pending = th
    th.start()


def settle(tu) -> None:
    """A step end: wait for the previous inferred step's thread (its exchange was pushed
    by every rank) and apply the settings it chose, from this step on."""
    th = getattr(tu, "pending", None)
    if th is None:
        return
    th.join()
    tu.pending = None
    queued, tu.queue = tu.queue, None
    if tu.failed is not None:
        log.warning("autotune (rank %d): stopped at step %d: %s", tu.rank, tu.step, tu.failed)
        tu.state = "done"
    for _, partition, credit in queued:
        tu.set(tu.step + 1, partition, credit)
    if queued:        # the step just ended ran with the old settings: not measured
        tu.start, tu.discard = tu.step + 1, True

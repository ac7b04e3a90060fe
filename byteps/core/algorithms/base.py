"""The algorithm interface (docs/algorithms.md).

An algorithm decides what is communicated (gradients or weights), when (every step,
in the background) and how results are combined.  Plugins call four hooks with
``{name: numpy array}`` dicts whose arrays they write back to the framework's tensors
(views where the framework allows, e.g. CPU torch tensors):

* :meth:`Algorithm.init` once, after the initial broadcast of the parameters;
* :meth:`Algorithm.reduce_gradients` after backward, before the local optimizer step
  (in place);
* :meth:`Algorithm.after_step` after the local optimizer step (parameters in place);
* :meth:`Algorithm.finish` at the end of training (all ranks).

Algorithms communicate only through :mod:`byteps.core.api` (push_pull with names), so
partitioning, priority, compression and the timeline come with them.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api


class Algorithm:
    """Base class: does nothing (each worker trains on its own)."""

    #: the plugins' gradient exchange (hooks overlapping backward) is used instead of
    #: :meth:`reduce_gradients` (only SyncPS)
    plugin_gradients = False

    def init(self, params: dict[str, np.ndarray]) -> None:
        """Called once with the (broadcast) parameters; may modify them in place."""

    def reduce_gradients(self, grads: dict[str, np.ndarray]) -> None:
        """Combine this step's gradients across workers, in place (default: no-op)."""

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        """After the local optimizer step: combine parameters, in place (default: no-op)."""

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """End of training (every rank calls it); may modify the parameters in place."""

    def describe(self) -> str:
        return type(self).__name__


class SyncPS(Algorithm):
    """Synchronous data parallelism through the servers (the default, today's behaviour):
    gradients are averaged every step before the local optimizer step."""

    plugin_gradients = True

    def __init__(self, prefix: str = "Gradient."):
        self.prefix = prefix

    def reduce_gradients(self, grads: dict[str, np.ndarray]) -> None:
        hs = [(g, api.push_pull_async(g, self.prefix + n, average=True, out=g,
                                      priority=-i))
              for i, (n, g) in enumerate(grads.items())]
        for _, h in hs:
            api.synchronize(h)


def average_now(params: dict[str, np.ndarray], prefix: str) -> None:
    """Replace ``params`` by their average over all workers (synchronous rounds)."""
    hs = [api.push_pull_async(p, prefix + n, average=True, out=p) for n, p in params.items()]
    for h in hs:
        api.synchronize(h)

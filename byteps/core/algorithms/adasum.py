"""Horovod's Adasum optimizer as an algorithm: ``DistributedOptimizer(opt, op=hvd.Adasum)``
in every plugin, or ``algorithm=bps.algorithms.Adasum()``.

As Horovod's (docs/adasum_user_guide.rst, "The distributed optimizer for AdaSum"): every
rank takes its local optimizer step on its own gradients, the change of each parameter
(the delta) is combined across the ranks with Adasum (byteps/core/collective/adasum.py),
and every rank sets the parameter to its value before the step plus the combined delta,
so the ranks stay identical.  The number of ranks must be a power of 2 and the parameters
floating point (Horovod's conditions); the learning rate is a single worker's (Adasum
does not average), which Horovod's guide suggests scaling by 2-2.5 on more ranks.
"""
from __future__ import annotations

import numpy as np

from byteps.core import compat
from byteps.core.algorithms.base import Algorithm, adopt_last_joiner


class Adasum(Algorithm):
    """Local step, then the parameter changes combined with Adasum (see the module)."""

    def __init__(self, prefix: str = "Adasum."):
        self.prefix = prefix
        self.start: dict[str, np.ndarray] | None = None

    def bind(self, compression_params=None, backward_passes_per_step: int = 1,
             subject: str | None = None) -> "Adasum":
        if compression_params:
            compat.refuse("adasum-compression", subject or self.describe())
        return super().bind(None, backward_passes_per_step, subject)

    check = bind

    def init(self, params: dict[str, np.ndarray]) -> None:
        from byteps.core.collective import adasum, ops
        for n, p in params.items():
            adasum.check(f"{self.describe()}: parameter {n!r}", p.dtype, ops.api.size())

    def before_step(self, params: dict[str, np.ndarray]) -> None:
        """The values the step starts from (after a broadcast or a checkpoint load, as
        Horovod takes them at every step)."""
        self.start = {n: p.copy() for n, p in params.items()}

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        from byteps.core.collective import ops
        if self.start is None:
            raise RuntimeError(f"{self.describe()}: after_step without before_step (the "
                               f"plugin must call Algorithm.before_step)")
        hs = [(n, ops.allreduce_async(params[n] - self.start[n], self.prefix + n,
                                      op=ops.ADASUM)) for n in params]
        for n, h in hs:
            np.add(self.start[n], ops._sync(h), out=params[n], casting="unsafe")
        self.start = None

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """Every step left the ranks identical; after a ``join()`` (uneven data) the ranks
        that joined early stopped stepping, so every rank takes the model of the rank
        that joined last, as SyncPS does."""
        adopt_last_joiner(params, f"{self.prefix}final.")

"""DistributedOptimizer for plain numpy training loops (and JAX users)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from byteps.core import algorithms as _alg
from byteps.core import api as _api


class DistributedOptimizer:
    """Wrap an update rule ``step_fn(params, grads)`` (in place on numpy arrays) with a
    training algorithm (docs/algorithms.md)::

        opt = bps.DistributedOptimizer(sgd, named_parameters={"w": w, "b": b},
                                       algorithm=bps.algorithms.AsyncModelAverage(500))
        for x, y in data:
            opt.step(grads(x, y))        # {name: gradient}
        opt.finish()                     # every rank ends with the same parameters

    ``named_parameters`` (dict or ``(name, array)`` pairs) are updated in place; they are
    broadcast from rank 0 first.  The default algorithm is SyncPS (AsyncPS with
    ``BYTEPS_ENABLE_ASYNC=1``).
    """

    def __init__(self, step_fn: Callable, named_parameters, algorithm=None,
                 root_rank: int = 0):
        self.step_fn = step_fn
        self.params = dict(named_parameters)
        for n, p in self.params.items():
            if not isinstance(p, np.ndarray) or not p.flags.c_contiguous:
                raise TypeError(f"parameter {n!r}: a C-contiguous numpy array is needed")
        self.algorithm = algorithm if algorithm is not None else _alg.default()
        if not isinstance(self.algorithm, _alg.Algorithm):
            raise TypeError(f"algorithm must be a byteps.algorithms.Algorithm, got "
                            f"{type(self.algorithm).__name__}")
        for n, p in self.params.items():
            np.copyto(p, _api.broadcast(p, root_rank, name="DistributedOptimizer." + n))
        self.algorithm.init(self.params)

    def step(self, grads: dict) -> None:
        """Combine ``grads`` (per the algorithm), apply ``step_fn``, combine parameters."""
        grads = {n: np.ascontiguousarray(grads[n]) for n in self.params if n in grads}
        self.algorithm.reduce_gradients(grads)
        self.step_fn(self.params, grads)
        self.algorithm.after_step(self.params)
        _api.step_done()

    def finish(self) -> None:
        """End of training: the algorithm's final exchange (identical parameters)."""
        self.algorithm.finish(self.params)

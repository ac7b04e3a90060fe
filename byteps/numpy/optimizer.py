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
    ``BYTEPS_ENABLE_ASYNC=1``).  ``compression_params`` (docs/compression.md) go to the
    algorithm, whatever it is (``Algorithm.bind``, the core's one rule);
    ``backward_passes_per_step=N`` sums the gradients of N ``step()`` calls locally and
    communicates and updates on every N-th call.
    """

    def __init__(self, step_fn: Callable, named_parameters, algorithm=None,
                 root_rank: int = 0, compression_params: dict | None = None,
                 backward_passes_per_step: int = 1):
        self.step_fn = step_fn
        self.params = dict(named_parameters)
        for n, p in self.params.items():
            if not isinstance(p, np.ndarray) or not p.flags.c_contiguous:
                raise TypeError(f"parameter {n!r}: a C-contiguous numpy array is needed")
        self.algorithm = _alg.resolve(algorithm, "byteps.numpy.DistributedOptimizer")
        self.algorithm.bind(compression_params, backward_passes_per_step,
                            subject="byteps.numpy.DistributedOptimizer")
        self._acc: dict | None = None       # gradients summed over the passes so far
        self._passes = 0
        for n, p in self.params.items():
            np.copyto(p, _api.broadcast(p, root_rank, name="DistributedOptimizer." + n))
        self.algorithm.init(self.params)

    def step(self, grads: dict) -> None:
        """Combine ``grads`` (per the algorithm), apply ``step_fn``, combine parameters."""
        grads = {n: np.ascontiguousarray(grads[n]) for n in self.params if n in grads}
        if self.algorithm.passes > 1:
            self._passes += 1
            if self._acc is None:
                self._acc = {n: g.copy() for n, g in grads.items()}
            else:
                for n, g in grads.items():
                    np.add(self._acc[n], g, out=self._acc[n])
            if self._passes < self.algorithm.passes:
                return
            grads, self._acc, self._passes = self._acc, None, 0
        self.algorithm.reduce_gradients(grads)
        self.algorithm.before_step(self.params)
        self.step_fn(self.params, grads)
        self.algorithm.after_step(self.params)
        _api.step_done()

    def finish(self) -> None:
        """End of training: the algorithm's final exchange (identical parameters)."""
        self.algorithm.finish(self.params)

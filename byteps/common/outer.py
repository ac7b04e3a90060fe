"""The outer optimizer step of DiLoCo, one rule for the servers that hold a key's global
parameters (byteps/server/outer.py) and for a worker that trains without servers
(byteps/core/algorithms/diloco.py): SGD with momentum, Nesterov or heavy ball, as
``torch.optim.SGD`` applies it to the averaged outer gradient ``g`` (the global
parameters at the round's start minus the workers' local parameters)::

    m = momentum * m + g
    x -= lr * (g + momentum * m)      # nesterov
    x -= lr * m                       # heavy ball

Computed in the parameters' dtype, in this order, so a replay with the same numpy
operations is bit for bit the same.
"""
from __future__ import annotations

import numpy as np


def outer_step(x: np.ndarray, m: np.ndarray, g: np.ndarray, lr: float, momentum: float,
               nesterov: bool, work: np.ndarray | None = None) -> None:
    """Apply one outer step to ``x`` (global parameters) and ``m`` (momentum), in place;
    ``work`` (``x``'s shape and dtype): the step's scratch, else one is allocated."""
    dt = x.dtype.type
    mu, lr_ = dt(momentum), dt(lr)
    np.multiply(m, mu, out=m)
    np.add(m, g, out=m)
    if nesterov:
        d = np.multiply(m, mu, out=work)
        np.add(d, g, out=d)
    elif work is None:
        d = m.copy()
    else:
        d = work
        np.copyto(d, m)
    np.multiply(d, lr_, out=d)
    np.subtract(x, d, out=x)

"""Asynchronous parameter server (the original BytePS's ``BYTEPS_ENABLE_ASYNC=1``).

The servers hold the parameters: rank 0's values seed them (every other rank pushes
zeros, then all pull), and after each local optimizer step a worker pushes the change of
its parameters since its last pull and pulls the servers' current value.  Every plugin
uses :class:`AsyncPS` for this rule (docs/algorithms.md).  Keys are asynchronous on the
servers (``wire.ASYNC``, :mod:`byteps.server.staleness`): a push is added at once,
``BYTEPS_ASYNC_STALENESS`` bounds how far a worker runs ahead.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api
from byteps.core.algorithms.base import Algorithm
from byteps.common.errors import BytePSError


def check_async(st, name: str, average: bool, op: int, params) -> None:
    """The rules of an asynchronous push_pull (raises BytePSError naming the fix)."""
    if average:
        raise BytePSError(
            f"tensor {name!r}: average=True is not available in asynchronous mode "
            f"(BYTEPS_ENABLE_ASYNC=1): a push adds this worker's delta to the servers' value "
            f"and the result is that value, which is never divided by the number of "
            f"workers; pass average=False (and push parameter deltas), or unset "
            f"BYTEPS_ENABLE_ASYNC to average synchronously")
    if op:
        raise BytePSError(f"tensor {name!r}: only sums are asynchronous (op={op})")
    if params:
        raise BytePSError(f"tensor {name!r}: gradient compression is not available with "
                          f"BYTEPS_ENABLE_ASYNC=1 (asynchronous mode sends parameter deltas); "
                          f"unset BYTEPS_ENABLE_ASYNC or drop compression_params")
    if st.local is not None:
        raise BytePSError(f"tensor {name!r}: asynchronous push_pull is not available with "
                          f"local reduction (BYTEPS_LOCAL_SIZE={st.cfg.local_size}); set "
                          f"BYTEPS_LOCAL_REDUCE=0")


def mode_change(st, name: str, asynchronous: bool) -> str:
    first = "synchronous" if asynchronous else "asynchronous"
    return (f"tensor {name!r} on rank {st.rank}: an {'a' if asynchronous else ''}synchronous "
            f"push_pull of a name first used {first}ly; a name keeps its mode (use another "
            f"name)")


_LOCAL: dict = {}


def local_add(st, name: str, src: np.ndarray) -> np.ndarray:
    """One process without servers: keep the 'servers' value' here; returns it."""
    key = (id(st), name)
    v = _LOCAL.get(key)
    if v is None:
        v = _LOCAL[key] = np.zeros_like(src)
    np.add(v, src, out=v)
    return v.copy()


class AsyncPS(Algorithm):
    """Asynchronous PS: push the parameter change after the local step, pull the global
    parameters.  Works on any ``{name: numpy array}`` (the plugins write results back).

    ``prefix`` names the servers' parameter keys (``AsyncParam.<name>``, as byteps.torch).
    """

    def __init__(self, prefix: str = "AsyncParam."):
        self.prefix = prefix
        self.last: dict[str, np.ndarray] = {}

    def _exchange(self, pushes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        hs = [(n, api.push_pull_async(a, self.prefix + n, average=False, priority=-i,
                                      asynchronous=True))
              for i, (n, a) in enumerate(pushes.items())]
        return {n: api.synchronize(h) for n, h in hs}

    def init(self, params: dict[str, np.ndarray]) -> None:
        """Seed the servers with rank 0's parameters; every rank pulls them."""
        seed = {n: p if api.rank() == 0 else np.zeros_like(p) for n, p in params.items()}
        self._exchange({n: np.ascontiguousarray(a) for n, a in seed.items()})
        api.barrier()                          # every seed push has been applied
        got = self._exchange({n: np.zeros_like(p) for n, p in params.items()})
        for n, p in params.items():
            np.copyto(p, got[n])
            self.last[n] = got[n].copy()

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        """Push ``params - last pulled`` and pull the servers' current value."""
        missing = [n for n in params if n not in self.last]
        if missing:
            raise BytePSError(f"AsyncPS: parameter(s) {missing[:3]} were not in init(); "
                              f"the optimizer's parameters must not change")
        got = self._exchange({n: p - self.last[n] for n, p in params.items()})
        for n, p in params.items():
            np.copyto(p, got[n])
            self.last[n] = got[n].copy()

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """After every rank's last push (a barrier): pull the servers' final value, so
        every rank ends with identical parameters."""
        api.barrier()
        got = self._exchange({n: np.zeros_like(p) for n, p in params.items()})
        for n, p in params.items():
            np.copyto(p, got[n])
            self.last[n] = got[n].copy()

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
    """The rules of an asynchronous push_pull (the refusals live in byteps.core.compat).

    Compression (``params`` or a declared name) and local reduction compose with it:
    the delta is compressed on its way out (per-partition error feedback on the worker)
    and, on a host with several workers, summed over shared memory first and pushed once
    by the host (docs/algorithms.md)."""
    from byteps.core import compat
    subject = f"tensor {name!r} on rank {st.rank}"
    if average:
        compat.refuse("async-average", subject)
    if op:
        compat.refuse("async-op", subject)


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
    ``compression_params`` (docs/compression.md, e.g. ``{"compressor": "onebit", "ef":
    "vanilla"}``) compresses the deltas a worker pushes, with one pipeline per partition
    whose error-feedback residual stays on the worker; the servers decompress each push,
    add it to their full-precision parameters at once and answer with those parameters,
    uncompressed.  The seed and the pulls of ``init``/``finish`` travel uncompressed
    (exact parameters, exact zeros).
    """

    compresses = "parameter differences"

    def __init__(self, prefix: str = "AsyncParam.", compression_params: dict | None = None):
        self.prefix = prefix
        self._set_compression(compression_params)    # a wrong key fails here, not mid-step
        self.last: dict[str, np.ndarray] = {}

    def describe(self) -> str:
        return "AsyncPS" + self._compressed()

    def _exchange(self, pushes: dict[str, np.ndarray], exact: bool = True) -> dict:
        """Push every array asynchronously and pull the servers' values.  ``exact``: push
        uncompressed (seeds, pulls); else the deltas are compressed when asked."""
        hs = [(n, api.push_pull_async(a, self.prefix + n, average=False, priority=-i,
                                      asynchronous=True,
                                      compression_params=self.compression_params,
                                      uncompressed=exact))
              for i, (n, a) in enumerate(pushes.items())]
        return {n: api.synchronize(h) for n, h in hs}

    def _pull(self, params: dict[str, np.ndarray]) -> None:
        got = self._exchange({n: np.zeros_like(p) for n, p in params.items()})
        for n, p in params.items():
            np.copyto(p, got[n])
            self.last[n] = got[n].copy()

    def init(self, params: dict[str, np.ndarray]) -> None:
        """Seed the servers with rank 0's parameters; every rank pulls them."""
        seed = {n: p if api.rank() == 0 else np.zeros_like(p) for n, p in params.items()}
        self._exchange({n: np.ascontiguousarray(a) for n, a in seed.items()})
        api.barrier()                          # every seed push has been applied
        self._pull(params)

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        """Push ``params - last pulled`` (compressed when asked) and pull the servers'
        current value."""
        missing = [n for n in params if n not in self.last]
        if missing:
            raise BytePSError(f"AsyncPS: parameter(s) {missing[:3]} were not in init(); "
                              f"the optimizer's parameters must not change")
        got = self._exchange({n: p - self.last[n] for n, p in params.items()}, exact=False)
        for n, p in params.items():
            np.copyto(p, got[n])
            self.last[n] = got[n].copy()

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """After every rank's last push (a barrier): pull the servers' final value, so
        every rank ends with identical parameters.  With error feedback, what a worker's
        residual still holds is dropped (it never reached the servers)."""
        api.barrier()
        self._pull(params)

"""The algorithm interface (docs/algorithms.md).

An algorithm decides what is communicated (gradients, parameter differences or
parameters), when (every step, in the background) and with whom (servers or peers).
Plugins call four hooks with ``{name: numpy array}`` dicts whose arrays they write back
to the framework's tensors (views where the framework allows, e.g. CPU torch tensors):

* :meth:`Algorithm.init` once, after the initial broadcast of the parameters;
* :meth:`Algorithm.reduce_gradients` after backward, before the local optimizer step
  (in place);
* :meth:`Algorithm.before_step` with the parameters just before the local optimizer step
  (plugins call it only where an algorithm overrides it: Adasum);
* :meth:`Algorithm.after_step` after the local optimizer step (parameters in place);
* :meth:`Algorithm.finish` at the end of training (all ranks).

Before the first hook a plugin hands the optimizer's settings to the algorithm with
:meth:`Algorithm.bind` (the one rule for every plugin): the compressor
(``compression_params``) and ``backward_passes_per_step``.  Every algorithm receives the
compressor (each applies it to what it exchanges: gradients, or parameter differences
with error feedback; never raw parameters), and with ``backward_passes_per_step = N``
the plugin accumulates N backward passes locally and the hooks run once per optimizer
step.

Algorithms communicate only through :mod:`byteps.core.api` (push_pull with names) or the
worker-to-worker links (:mod:`byteps.core.algorithms.peers`), so partitioning, priority,
compression and the timeline come with them.
"""
from __future__ import annotations

import numpy as np

from byteps.core import api
from byteps.core import compat


class Algorithm:
    """Base class: does nothing (each worker trains on its own)."""

    #: the plugins' gradient exchange (hooks overlapping backward) is used instead of
    #: :meth:`reduce_gradients` (only SyncPS)
    plugin_gradients = False
    #: what :meth:`bind`'s compressor compresses (docs/algorithms.md's table)
    compresses = "nothing"
    #: the validated ``compression_params`` (None: uncompressed); set by the constructor
    #: or by :meth:`bind`
    compression_params: dict | None = None
    #: backward passes accumulated locally per optimizer step (set by :meth:`bind`)
    passes = 1

    def _set_compression(self, compression_params) -> None:
        """The constructor's ``compression_params=`` (validated now, a clear error)."""
        self.compression_params = _validated(compression_params, self)

    def bind(self, compression_params=None, backward_passes_per_step: int = 1,
             subject: str | None = None) -> "Algorithm":
        """Hand the optimizer's settings to this algorithm: the one rule every plugin
        calls (``Algorithm.check`` is the same call).

        ``compression_params`` (the original BytePS keys) becomes this algorithm's
        compressor unless its constructor already got one (the same settings twice are
        fine; different ones are an error naming both).  Compressor momentum
        (``"momentum": "nesterov"``) is refused for algorithms that exchange parameters
        (rule ``algorithm-momentum``).  ``backward_passes_per_step`` is accepted for every
        algorithm: the plugin accumulates that many passes locally, then the hooks run
        on the optimizer step.  Returns ``self``."""
        who = subject or self.describe()
        if type(backward_passes_per_step) is not int or backward_passes_per_step < 1:
            raise ValueError(f"{who}: backward_passes_per_step must be an int >= 1, got "
                             f"{backward_passes_per_step!r}")
        params = _validated(compression_params, self, who)
        if params and self.compression_params and \
                _spec(params) != _spec(self.compression_params):
            raise ValueError(f"{who}: the optimizer's compression_params={compression_params!r} "
                             f"differ from the algorithm's own "
                             f"{self.compression_params!r}; pass them in one place")
        if params and not self.compression_params:
            self.compression_params = params
        self.passes = backward_passes_per_step
        return self

    check = bind

    def init(self, params: dict[str, np.ndarray]) -> None:
        """Called once with the (broadcast) parameters; may modify them in place."""

    def reduce_gradients(self, grads: dict[str, np.ndarray]) -> None:
        """Combine this step's gradients across workers, in place (default: no-op)."""

    def before_step(self, params: dict[str, np.ndarray]) -> None:
        """The parameters just before the local optimizer step (read only; default: no-op;
        plugins skip the call unless a subclass overrides it, see :func:`wants`)."""

    def after_step(self, params: dict[str, np.ndarray]) -> None:
        """After the local optimizer step: combine parameters, in place (default: no-op)."""

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """End of training (every rank calls it); may modify the parameters in place."""

    def describe(self) -> str:
        return type(self).__name__

    def _compressed(self) -> str:
        return "" if not self.compression_params else \
            f", compression={_spec(self.compression_params).describe()}"


def wants(algorithm: Algorithm, hook: str) -> bool:
    """Whether ``algorithm`` overrides ``hook`` (``"before_step"``, ``"reduce_gradients"``):
    plugins skip building the arrays of a hook nobody overrides."""
    return getattr(type(algorithm), hook) is not getattr(Algorithm, hook)


def _spec(params):
    from byteps import compression
    return compression.parse(params)


def _validated(params, alg: Algorithm, who: str | None = None) -> dict | None:
    """``params`` as a dict after a clear error for bad keys or values; None when empty.
    Compressor momentum is refused unless the algorithm exchanges gradients."""
    if not params:
        return None
    if not isinstance(params, dict):
        raise TypeError(f"compression_params must be a dict, got {type(params).__name__}")
    spec = _spec(params)
    if spec is None:
        return None
    if spec.momentum and not alg.plugin_gradients and alg.compresses != "gradients":
        compat.refuse("algorithm-momentum", who or type(alg).__name__)
    return dict(params)


class SyncPS(Algorithm):
    """Synchronous data parallelism through the servers (the default, today's behaviour):
    gradients are averaged every step before the local optimizer step.  With a compressor
    the gradients are compressed in the core (the plugins declare their names with it)."""

    plugin_gradients = True
    compresses = "gradients"

    def __init__(self, prefix: str = "Gradient.", compression_params=None):
        self.prefix = prefix
        self._set_compression(compression_params)

    def reduce_gradients(self, grads: dict[str, np.ndarray]) -> None:
        hs = [(g, api.push_pull_async(g, self.prefix + n, average=True, out=g,
                                      priority=-i, compression_params=self.compression_params))
              for i, (n, g) in enumerate(grads.items())]
        for _, h in hs:
            api.synchronize(h)

    def finish(self, params: dict[str, np.ndarray]) -> None:
        """After :func:`join` (uneven data) the ranks that joined early stopped stepping:
        every rank takes the model of the rank that joined last (it took every step), as
        Horovod's ``join()`` return value is meant for.  Without a join: nothing to do."""
        adopt_last_joiner(params, f"{self.prefix}final.")


def adopt_last_joiner(params: dict[str, np.ndarray], prefix: str) -> bool:
    """Every rank takes the parameters of the rank that joined last, when a :func:`join`
    completed since init(): ranks that joined early stopped training, the last one took
    every step.  Returns whether it did (every rank returns the same)."""
    last = api.last_joined()
    if last is None or api.size() == 1:
        return False
    hs = [api.broadcast_async(p, last, name=f"{prefix}{n}", out=p) for n, p in params.items()]
    for h in hs:
        api.synchronize(h)
    return True


def average_now(params: dict[str, np.ndarray], prefix: str) -> None:
    """Replace ``params`` by their average over the ranks that take part (synchronous
    rounds).  A rank inside :func:`join` adds zeros, so the sum is divided by the number
    of contributions, counted in the same round, not by ``size()``: a model average never
    shrinks toward zero while a rank has joined."""
    hs = [api.push_pull_async(p, prefix + n, average=False, out=p) for n, p in params.items()]
    n = contributors(prefix)
    for h in hs:
        api.synchronize(h)
    for p in params.values():
        np.divide(p, n, out=p, casting="unsafe")


def contributors(prefix: str) -> float:
    """How many ranks contribute to the round the caller has just pushed under ``prefix``
    (a joined rank adds zero); every rank gets the same count."""
    return float(api.push_pull(np.ones(1, np.float64), prefix + "#contributors",
                               average=False)[0])

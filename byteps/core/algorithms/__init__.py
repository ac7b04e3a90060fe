"""Training algorithms behind one interface (docs/algorithms.md).

``SyncPS`` (default: gradients averaged every step), ``AsyncPS`` (the original's
asynchronous mode: parameter deltas, servers hold the parameters),
``AsyncModelAverage`` (local training, background model averaging), ``DiLoCo`` (local
inner steps, an outer Nesterov step on the servers every H steps), ``Decentralized`` and
``LowPrecisionDecentralized`` (peer-to-peer model averaging).  Write your own by
subclassing :class:`Algorithm`.
"""
from byteps.core.algorithms.async_ps import AsyncPS
from byteps.core.algorithms.base import Algorithm, SyncPS, average_now
from byteps.core.algorithms.diloco import DiLoCo
from byteps.core.algorithms.decentralized import Decentralized, LowPrecisionDecentralized
from byteps.core.algorithms.model_average import AsyncModelAverage

__all__ = ["Algorithm", "SyncPS", "AsyncPS", "AsyncModelAverage", "DiLoCo", "Decentralized",
           "LowPrecisionDecentralized", "average_now", "default", "resolve"]


def default() -> Algorithm:
    """The algorithm a plugin uses when none is given: AsyncPS with
    ``BYTEPS_ENABLE_ASYNC=1``, else SyncPS."""
    from byteps.core import state
    return AsyncPS() if state.get_config().enable_async else SyncPS()


def resolve(algorithm, subject: str = "DistributedOptimizer") -> Algorithm:
    """The algorithm a plugin runs, decided here for every plugin: ``algorithm`` itself
    (a TypeError naming ``subject`` when it is not an :class:`Algorithm`), or
    :func:`default` when None."""
    if algorithm is None:
        return default()
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"{subject}: algorithm must be a byteps.algorithms.Algorithm "
                        f"(SyncPS, AsyncPS, AsyncModelAverage, DiLoCo, Decentralized or a "
                        f"subclass), "
                        f"got {type(algorithm).__name__}")
    return algorithm

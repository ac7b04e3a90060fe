"""Training algorithms behind one interface (docs/algorithms.md).

``SyncPS`` (default: gradients averaged every step), ``AsyncPS`` (the original's
asynchronous mode: parameter deltas, servers hold the parameters),
``AsyncModelAverage`` (local training, background model averaging), ``DiLoCo`` (local
inner steps, an outer Nesterov step on the servers every H steps), ``Decentralized`` and
``LowPrecisionDecentralized`` (peer-to-peer model averaging), ``Adasum`` (Horovod's Adasum
optimizer: local steps, the parameter changes combined with Adasum; what ``op=Adasum``
selects).  Write your own by subclassing :class:`Algorithm`.
"""
from byteps.core.algorithms.adasum import Adasum
from byteps.core.algorithms.async_ps import AsyncPS
from byteps.core.algorithms.base import Algorithm, SyncPS, average_now, wants
from byteps.core.algorithms.diloco import DiLoCo
from byteps.core.algorithms.decentralized import Decentralized, LowPrecisionDecentralized
from byteps.core.algorithms.model_average import AsyncModelAverage

__all__ = ["Algorithm", "SyncPS", "AsyncPS", "AsyncModelAverage", "DiLoCo", "Decentralized",
           "LowPrecisionDecentralized", "Adasum", "average_now", "default", "resolve", "wants"]


def default() -> Algorithm:
    """The algorithm a plugin uses when none is given: AsyncPS with
    ``BYTEPS_ENABLE_ASYNC=1``, else SyncPS."""
    from byteps.core import state
    return AsyncPS() if state.get_config().enable_async else SyncPS()


def resolve(algorithm, subject: str = "DistributedOptimizer", op=None) -> Algorithm:
    """The algorithm a plugin runs, decided here for every plugin: ``algorithm`` itself
    (a TypeError naming ``subject`` when it is not an :class:`Algorithm`), or
    :func:`default` when None.  Horovod's ``op=Adasum`` is the :class:`Adasum`
    algorithm (another algorithm with it is a ValueError)."""
    from byteps.core.collective.rules import is_adasum
    if is_adasum(op):
        if algorithm is None:
            return Adasum()
        if not isinstance(algorithm, Adasum):
            raise ValueError(f"{subject}: op=Adasum is the Adasum algorithm, and "
                             f"algorithm={type(algorithm).__name__} is another; give one")
    if algorithm is None:
        return default()
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"{subject}: algorithm must be a byteps.algorithms.Algorithm "
                        f"(SyncPS, AsyncPS, AsyncModelAverage, DiLoCo, Decentralized or a "
                        f"subclass), "
                        f"got {type(algorithm).__name__}")
    return algorithm

"""Training algorithms behind one interface (docs/algorithms.md).

``SyncPS`` (default: gradients averaged every step), ``AsyncPS`` (the original's
asynchronous mode: parameter deltas, servers hold the parameters),
``AsyncModelAverage`` (local training, background model averaging), ``Decentralized`` and
``LowPrecisionDecentralized`` (peer-to-peer model averaging).  Write your own by
subclassing :class:`Algorithm`.
"""
from byteps.core.algorithms.async_ps import AsyncPS
from byteps.core.algorithms.base import Algorithm, SyncPS, average_now
from byteps.core.algorithms.decentralized import Decentralized, LowPrecisionDecentralized
from byteps.core.algorithms.model_average import AsyncModelAverage

__all__ = ["Algorithm", "SyncPS", "AsyncPS", "AsyncModelAverage", "Decentralized",
           "LowPrecisionDecentralized", "average_now", "default"]


def default() -> Algorithm:
    """The algorithm a plugin uses when none is given: AsyncPS with
    ``BYTEPS_ENABLE_ASYNC=1``, else SyncPS."""
    from byteps.core import api
    return AsyncPS() if api.get_config().enable_async else SyncPS()

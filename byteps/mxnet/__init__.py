"""byteps.mxnet — BytePS for MXNet / Gluon, with the original BytePS names.

    import byteps.mxnet as bps
    bps.init()
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": 0.1, "momentum": 0.9})
    ...
    trainer.step(batch_size)

Importing this module imports mxnet (1.9.1 needs numpy<1.24; see docs/mxnet.md).
"""
from __future__ import annotations

from byteps.core.api import (
    BytePSError,
    is_initialized,
    join,
    local_rank,
    local_size,
    rank,
    size,
)
from byteps.mxnet._mx import mx  # noqa: F401  (restores torch's thread count)
from byteps.core.api.basics import __all__ as _basics_names
from byteps.core.api.basics import *  # noqa: F401,F403  (build info, cross_rank, timeline)
from byteps.core.api.basics import init, shutdown
from byteps.mxnet.collectives import __all__ as _coll_names
from byteps.mxnet.collectives import *  # noqa: F401,F403  (Horovod's collectives)
from byteps.mxnet.compression import Compression, parse_compression
from byteps.mxnet.ops import broadcast_parameters, byteps_declare_tensor, byteps_push_pull
from byteps.mxnet.optimizer import DistributedOptimizer
from byteps.mxnet.trainer import DistributedTrainer

__all__ = ["BytePSError", "Compression", "DistributedOptimizer", "DistributedTrainer", "broadcast_parameters",
           "byteps_declare_tensor", "byteps_push_pull", "init", "is_initialized",
           "join", "local_rank", "local_size", "parse_compression", "rank", "shutdown", "size",
           "nccl_built", "cuda_built", "rocm_built"] + list(_coll_names) + \
    [n for n in _basics_names if n not in ("global_only", "process_set_kw", "init", "shutdown")]


def cuda_built() -> bool:
    """True when MXNet is built with CUDA (GPU NDArrays are copied through host memory)."""
    return bool(mx.runtime.Features().is_enabled("CUDA"))


def nccl_built() -> bool:
    """False: byteps moves MXNet arrays through host memory, not NCCL."""
    return False


def rocm_built() -> bool:
    """False: no ROCm build of MXNet is supported."""
    return False

from byteps.core.api import get_pushpull_speed  # noqa: E402  (telemetry, as the original)
from byteps.core import algorithms  # noqa: E402  (bps.algorithms.AsyncPS, Decentralized, ...)

__all__ = list(__all__) + ["get_pushpull_speed", "algorithms"]

from byteps.core.elastic import resume, suspend  # noqa: E402  (the original's elastic calls)

__all__ = list(__all__) + ["suspend", "resume"]

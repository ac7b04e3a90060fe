"""Run a BytePS job on a Ray cluster: ``byteps.ray.RayExecutor`` (Horovod's
``horovod.ray.RayExecutor``, whose scripts run with the import changed).

    import ray
    from byteps.ray import RayExecutor

    def train(lr):
        import byteps.torch as bps
        bps.init()
        ...
        return bps.rank(), final_loss

    ray.init()                          # or ray.init(address="auto") on a cluster
    ex = RayExecutor(num_workers=4, num_servers=2, cpus_per_worker=1, use_gpu=False)
    ex.start()
    results = ex.run(train, kwargs={"lr": 0.1})    # one result per rank, ordered by rank
    ex.shutdown()

The scheduler, the servers and the workers are Ray actors in one placement group; the
scheduler and servers run byteps' own processes (``python -m byteps.launcher._scheduler``,
``python -m byteps.server``), each worker actor runs ``train_fn`` with the ``DMLC_*`` /
``BYTEPS_*`` variables of one worker.  See docs/deployment.md ("Ray").
"""
from __future__ import annotations

try:
    import ray as _ray  # noqa: F401
except ImportError as _exc:          # pragma: no cover - depends on the environment
    raise ImportError(
        "byteps.ray needs Ray, which is not installed: pip install 'byteps-ps[ray]' "
        "(or pip install 'ray>=2.10')") from _exc

from byteps.ray.errors import RayExecutorError, WorkerFailedError
from byteps.ray.executor import RayExecutor

__all__ = ["RayExecutor", "RayExecutorError", "WorkerFailedError"]

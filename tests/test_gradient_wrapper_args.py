"""Horovod's module paths resolve to byteps' names, and Horovod's gradient wrappers take
Horovod's arguments in Horovod's order in every plugin (a script passing them positionally
or by name works with only the import changed); ``gradient_predivide_factor``,
``num_groups`` and ``groups`` are checked by one core rule
(byteps.core.api.basics.check_gradient_grouping): accepted with valid values, refused with
Horovod's reasons otherwise.  One process, no job."""
from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.timeout(120)

# Horovod's signatures (horovod/tensorflow/__init__.py, horovod/tensorflow/keras/__init__.py,
# horovod/torch/optimizer.py at the vendored suites' commit), first argument dropped
HOROVOD = {
    "tf.DistributedOptimizer": ["name", "use_locking", "device_dense", "device_sparse",
                                "compression", "sparse_as_dense", "backward_passes_per_step",
                                "op", "gradient_predivide_factor",
                                "average_aggregated_gradients", "num_groups", "groups",
                                "process_set", "scale_local_gradients"],
    "tf.DistributedGradientTape": ["device_dense", "device_sparse", "compression",
                                   "sparse_as_dense", "op", "gradient_predivide_factor",
                                   "num_groups", "groups", "process_set",
                                   "scale_local_gradients"],
    "keras.DistributedOptimizer": ["name", "device_dense", "device_sparse", "compression",
                                   "sparse_as_dense", "gradient_predivide_factor", "op",
                                   "backward_passes_per_step",
                                   "average_aggregated_gradients", "num_groups", "groups",
                                   "process_set", "scale_local_gradients"],
    "torch.DistributedOptimizer": ["named_parameters", "compression",
                                   "backward_passes_per_step", "op",
                                   "gradient_predivide_factor", "num_groups", "groups",
                                   "sparse_as_dense", "process_set"],
}


def _wrappers():
    import byteps.keras as kbps
    import byteps.tensorflow as tbps
    import byteps.torch as pbps
    return {"tf.DistributedOptimizer": tbps.DistributedOptimizer,
            "tf.DistributedGradientTape": tbps.DistributedGradientTape,
            "keras.DistributedOptimizer": kbps.DistributedOptimizer,
            "torch.DistributedOptimizer": pbps.DistributedOptimizer}


def test_signatures_follow_horovods_order():
    pytest.importorskip("tensorflow")
    for key, fn in _wrappers().items():
        names = list(inspect.signature(fn).parameters)[1:]
        horovod = HOROVOD[key]
        if key == "torch.DistributedOptimizer":     # byteps' staleness sits after passes
            names = [n for n in names if n != "staleness"]
        assert names[:len(horovod)] == horovod, (key, names)


def _makers():
    import keras
    import tensorflow as tf
    import torch

    import byteps.tensorflow as tbps
    w = _wrappers()
    return {
        "tf.DistributedOptimizer":
            lambda **k: w["tf.DistributedOptimizer"](keras.optimizers.SGD(0.1), **k),
        "tf.DistributedGradientTape":
            lambda **k: w["tf.DistributedGradientTape"](tf.GradientTape(), **k),
        "keras.DistributedOptimizer":
            lambda **k: w["keras.DistributedOptimizer"](keras.optimizers.SGD(0.1), **k),
        "torch.DistributedOptimizer":
            lambda **k: w["torch.DistributedOptimizer"](
                torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), **k),
    }, tbps


@pytest.fixture
def local_job(monkeypatch):
    """A job of one worker in this process (no launcher variables), left afterwards."""
    for k in ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        monkeypatch.delenv(k, raising=False)
    import byteps.torch as pbps
    pbps.init()
    yield
    pbps.shutdown()


@pytest.mark.parametrize("key", sorted(HOROVOD))
def test_grouping_arguments_are_checked_once(key, local_job):
    pytest.importorskip("tensorflow")
    makers, tbps = _makers()
    make = makers[key]
    make(gradient_predivide_factor=2.0, num_groups=3)      # the same average
    make(groups=2)
    make(groups=[[], []])
    bad = [({"gradient_predivide_factor": 0}, "must be a number > 0"),
           ({"gradient_predivide_factor": 2.0, "op": tbps.Sum}, "op is not Average"),
           ({"num_groups": -1}, "num_groups must be an int >= 0"),
           ({"groups": "x"}, "groups must be an int >= 0 or a list of lists")]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            make(**kwargs)


def test_horovods_module_paths_import():
    """Horovod's module paths that scripts import from resolve to byteps' own names:
    ``horovod.torch.mpi_ops``, ``horovod.tensorflow.mpi_ops`` (with the basic queries),
    ``horovod.tensorflow.keras.elastic`` and ``horovod.runner.common.util.env``."""
    pytest.importorskip("tensorflow")
    import byteps.keras.elastic as kel
    import byteps.tensorflow as tbps
    import byteps.tensorflow.keras as tkbps
    import byteps.torch as pbps
    from byteps.runner.common.util.env import get_env_rank_and_size  # noqa: F401
    from byteps.tensorflow.keras.elastic import KerasState, run
    from byteps.tensorflow.mpi_ops import add_process_set, allreduce, rank, size
    from byteps.torch.mpi_ops import allreduce_async, synchronize
    assert (run, KerasState) == (kel.run, kel.KerasState) and tkbps.elastic.run is run
    assert (rank, size, add_process_set, allreduce) == \
        (tbps.rank, tbps.size, tbps.add_process_set, tbps.allreduce)
    assert (synchronize, allreduce_async) == (pbps.synchronize, pbps.allreduce_async)
    assert pbps.mpi_ops._basics._get_process_set_ids_and_ranks is \
        tbps.mpi_ops._basics._get_process_set_ids_and_ranks
    with pytest.raises(AttributeError):
        tbps.mpi_ops.no_such_name

"""Every collective of byteps.tensorflow through both Keras front ends (byteps.keras and
byteps.tensorflow.keras, generated from byteps/_keras), in a job of 2 workers
(tests/scripts/keras_collectives.py)."""
import importlib.util

import pytest
from conftest import assert_ok, read_results, run_script

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed (pip install -e '.[tensorflow]')",
                allow_module_level=True)

CHECKS = ["alltoall", "alltoall splits", "alltoall received splits",
          "grouped_allreduce sum", "grouped_allreduce int", "grouped_allreduce average",
          "grouped_allgather", "grouped_allgather ragged", "grouped_reducescatter",
          "grouped_reducescatter 1d", "allreduce global set", "broadcast global set",
          "barrier", "process sets", "objects"]


@pytest.mark.timeout(400)
def test_every_collective_in_both_keras_front_ends(tmp_path):
    res = run_script("keras_collectives.py", tmp_path, workers=2, servers=1, timeout=300,
                     BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1]
    for fe in ("keras", "tensorflow.keras"):
        for rank in (0, 1):
            missing = [c for c in CHECKS if c not in done[rank][fe]]
            assert not missing, (fe, rank, missing)
        # the set of rank 1 only: its members ran the set's collectives, the others not
        assert {"set allreduce", "set allgather", "set grouped_allreduce", "set alltoall",
                "set barrier"} <= set(done[1][fe])
        assert "set allreduce" not in done[0][fe]
    assert "join" in done[0]["tensorflow.keras"]
    assert "graph grouped_allreduce" in done[1]["tensorflow.keras"]


def test_front_ends_are_generated_from_one_definition():
    """Both front ends export the same names, bound to their Keras, with no copy of code."""
    import byteps.keras as bk
    import byteps.tensorflow as bps
    import byteps.tensorflow.keras as tk
    assert bk.__all__ == tk.__all__
    for name in ("alltoall", "grouped_allreduce", "grouped_allgather",
                 "grouped_reducescatter", "barrier", "ProcessSet", "add_process_set",
                 "remove_process_set", "global_process_set", "broadcast_object",
                 "allgather_object", "join", "QAdamOptimizer", "DistributedOptimizer"):
        assert name in bk.__all__, name
    # every collective of byteps.tensorflow (those that are not TF-graph specific)
    tf_only = {"DistributedGradientTape", "broadcast_variables", "broadcast_", "finish",
               "broadcast_object_fn", "local_rank_op", "local_size_op", "rank_op",
               "size_op", "process_set_included_op", "PartialDistributedGradientTape",
               "SyncBatchNormalization", "BroadcastGlobalVariablesHook"}
    # (horovod.tensorflow.keras has none of these: TF graph and tape tools)
    assert [n for n in bps.__all__ if n not in tf_only and n not in bk.__all__] == []
    assert bk.callbacks.MetricAverageCallback.__module__ == "byteps.keras.callbacks"
    assert tk.callbacks.MetricAverageCallback.__module__ == "byteps.tensorflow.keras.callbacks"
    assert bk.DistributedOptimizer.__module__ == "byteps.keras"
    for path in ("byteps/keras/__init__.py", "byteps/tensorflow/keras/__init__.py",
                 "byteps/keras/callbacks.py", "byteps/tensorflow/keras/callbacks.py"):
        src = (importlib.util.find_spec("byteps").submodule_search_locations[0] + "/"
               + path[len("byteps/"):])
        assert "def " not in open(src).read(), f"{path} defines code: generate it in _keras"

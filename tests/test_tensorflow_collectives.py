"""Horovod's collectives through byteps.tensorflow and byteps.keras
(tests/scripts/coll_tf.py) in a real job: every op eagerly, inside tf.function and in a
TF1 graph, dtypes, gradients, a process set of 2 of 3 ranks, errors that name the ranks
(tf.errors classes, as Horovod), in a job of 3 workers."""
from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from conftest import assert_ok, read_results, run_script  # noqa: E402


def test_tensorflow_collectives_in_a_job(tmp_path):
    res = run_script("coll_tf.py", tmp_path, workers=3, servers=2, timeout=300,
                     BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1, 2]
    common = [c for c in done[0] if not c.startswith("set ")]    # process-set members only
    assert all([c for c in d if not c.startswith("set ")] == common for d in done.values())
    for check in ("build info", "sum bfloat16", "min uint16", "prescale/postscale int32",
                  "function alltoall", "IndexedSlices average values", "allgather complex64",
                  "allgather bool", "broadcast bool 1", "broadcast_ variables",
                  "reducescatter average", "alltoall received splits", "grad allgather",
                  "grad broadcast", "grad reducescatter", "grad alltoall shape",
                  "function grad allgather", "graph grad", "keras reducescatter",
                  "allgather shape error", "broadcast root error", "alltoall splits error",
                  "alltoall equal split error", "function allgather shape error",
                  "collectives work after errors", "join", "objects"):
        assert check in done[0], check
    import byteps.tensorflow as hvd
    if hasattr(hvd, "add_process_set"):                 # a set of ranks 0 and 2
        assert "set grad allgather" in done[2] and "set alltoall" not in done[1]

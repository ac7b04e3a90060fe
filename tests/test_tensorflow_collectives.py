"""Horovod's collectives through byteps.tensorflow and byteps.keras
(tests/scripts/coll_tf.py) in a real job: every op eagerly, inside tf.function and in a
TF1 graph, dtypes, gradients, errors that name the ranks (tf.errors classes, as Horovod)."""
from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from conftest import assert_ok, read_results, run_script  # noqa: E402


def test_tensorflow_collectives_in_a_job(tmp_path):
    res = run_script("coll_tf.py", tmp_path, workers=2, servers=1, timeout=240,
                     BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1]
    assert done[0] == done[1]
    for check in ("build info", "sum bfloat16", "min uint16", "prescale/postscale int32",
                  "function alltoall", "IndexedSlices average values", "allgather complex64",
                  "allgather bool", "broadcast bool 1", "broadcast_ variables",
                  "reducescatter average", "alltoall received splits", "grad allgather",
                  "grad broadcast", "grad reducescatter", "grad alltoall shape",
                  "function grad allgather", "graph grad", "keras reducescatter",
                  "allgather shape error", "broadcast root error", "alltoall splits error",
                  "alltoall equal split error", "function allgather shape error",
                  "collectives work after errors", "join"):
        assert check in done[0], check

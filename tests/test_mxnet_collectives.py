"""Horovod's MXNet collectives through byteps.mxnet (tests/scripts/coll_mxnet.py) on mx.nd
arrays in a real job of 3 workers: every op against numpy references, in-place forms,
errors that name the ranks.  Skipped where MXNet is not installed (make test-mxnet runs it
in .venv-mxnet)."""
from __future__ import annotations

import pytest

pytest.importorskip("mxnet")

from conftest import assert_ok, read_results, run_script  # noqa: E402


def test_mxnet_collectives_in_a_job(tmp_path):
    res = run_script("coll_mxnet.py", tmp_path, workers=3, servers=2, timeout=150,
                     BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1, 2]
    assert all(d == done[0] for d in done.values())
    for check in ("build info", "sum int8", "allreduce_ product", "prescale int32",
                  "grouped_allreduce_", "allgather", "broadcast from 2", "broadcast_",
                  "reducescatter sum", "alltoall splits", "allgather shape error",
                  "broadcast root error", "collectives work after errors"):
        assert check in done[0], check

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


@pytest.mark.timeout(150)
def test_trainers_of_process_sets_in_a_job(tmp_path):
    """DistributedTrainer(process_set=[1, 3]) on those ranks only, 2 hosts x 2, each rank
    initialised with its own seed: the members start from one model (broadcast among the
    set, from its first rank as root_rank 0 is not in it) and end identical; nothing
    waits.  Before, the trainer's initial broadcast was the whole job's and waited for
    ranks that make no trainer."""
    res = run_script("mx_set_trainer.py", tmp_path, workers=4, timeout=100,
                     launcher_args=("--hosts", "2", "--local-size", "2"))
    assert_ok(res)
    out = read_results(tmp_path)
    assert out[0] == {} and out[2] == {}, out
    assert out[1] == out[3] and out[1]["final"] != out[1]["init"], out

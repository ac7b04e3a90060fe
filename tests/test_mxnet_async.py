"""byteps.mxnet in asynchronous mode (BYTEPS_ENABLE_ASYNC=1): the core's AsyncPS."""
import re
import sys

import pytest

from conftest import ROOT, SCRIPTS, assert_ok, read_results, run_job

pytest.importorskip("mxnet")


@pytest.mark.timeout(160)
def test_mxnet_digits_async_two_workers():
    res = run_job([sys.executable, str(ROOT / "examples" / "mxnet" / "train_digits_gluon.py")],
                  workers=2, servers=1, timeout=150, BYTEPS_ENABLE_ASYNC=1,
                  BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    acc = float(re.search(r"test accuracy: ([0-9.]+)", res.stdout).group(1))
    assert acc > 0.9, res.stdout


@pytest.mark.timeout(160)
def test_mxnet_digits_decentralized_four_workers():
    """DistributedTrainer(algorithm=Decentralized(shift_one)) over peer sockets."""
    res = run_job([sys.executable, str(ROOT / "examples" / "mxnet" / "train_digits_gluon.py"),
                   "--algorithm", "shift_one"], workers=4, servers=1, timeout=150,
                  BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    acc = float(re.search(r"test accuracy: ([0-9.]+)", res.stdout).group(1))
    assert acc > 0.9, res.stdout


@pytest.mark.timeout(200)
def test_mxnet_distributed_optimizer_async_two_workers(tmp_path):
    """DistributedOptimizer under BYTEPS_ENABLE_ASYNC=1 trains through the core's AsyncPS
    (rank 0 takes 3x the steps of rank 1: nobody waits for the other's steps); after
    finish() both ranks hold the servers' parameters."""
    res = run_job([sys.executable, str(SCRIPTS / "mx_async_optimizer.py"), str(tmp_path)],
                  workers=2, servers=1, timeout=180, BYTEPS_ENABLE_ASYNC=1,
                  BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    assert out[0]["steps"] == 3 * out[1]["steps"]
    for r, o in out.items():
        assert o["accuracy"] > 0.9, (r, o["accuracy"])
    assert out[0]["digest"] == out[1]["digest"]

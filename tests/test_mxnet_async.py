"""byteps.mxnet in asynchronous mode (BYTEPS_ENABLE_ASYNC=1): the core's AsyncPS."""
import re
import sys

import pytest

from conftest import ROOT, assert_ok, run_job

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

"""Horovod's current MXNet suite (tests/horovod/parallel/test_mxnet1.py and test_mxnet2.py
over base_test_mxnet.py, import line changed only) in byteps jobs, run by
tests/horovod/run.py under .venv-mxnet (``make test-mxnet`` collects this file there;
skipped where MXNet is not installed).

The default run takes the tests once fixed for the suite (a name reused with min, max and
product after sum; Horovod's Compression; broadcast_parameters(prefix=) and deferred
initialisation; DistributedOptimizer(process_set=)); the whole suite in every layout runs
under ``-m horovod_full`` (about 15 s a layout):

    .venv-mxnet/bin/python -m pytest -m horovod_full tests/test_mxnet_hvd_suite.py
    .venv-mxnet/bin/python tests/horovod/run.py --suite test_mxnet1.py --layout local2
"""
from __future__ import annotations

import pytest

pytest.importorskip("mxnet")

from tests.test_horovod_suites import _check as _check_suite  # noqa: E402

SUBSET = ("test_horovod_allreduce_average or test_horovod_allreduce_min or "
          "test_horovod_allreduce_max or test_horovod_allreduce_product or "
          "test_compression_fp16 or test_two_trainer or "
          "test_horovod_broadcast_deferred_init_parameters or test_optimizer_process_sets")


def _check(tmp_path, suite, layout, select=None, reverse=False, passed=1):
    """tests/test_horovod_suites.py's check: every rank wrote a report, no failure that
    tests/horovod/run.py does not know, at least ``passed`` passed tests on each rank."""
    _check_suite(tmp_path, layout, select, reverse, 600, suite, passed)


def test_horovod_mxnet_suite_subset(tmp_path):
    """The tests fixed for Horovod's MXNet suite, in reverse order, 2 workers on 2 hosts."""
    _check(tmp_path, "test_mxnet1.py", "2hosts", SUBSET, reverse=True, passed=8)


@pytest.mark.horovod_full
@pytest.mark.parametrize("layout", ["2hosts", "local2", "3workers"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
def test_horovod_mxnet_suite(tmp_path, layout, reverse):
    """Every test of Horovod's test_mxnet1.py passes or is skipped by the suite itself
    (GPU only, MXNet < 1.5), whatever the order."""
    _check(tmp_path, "test_mxnet1.py", layout, reverse=reverse, passed=50)


@pytest.mark.horovod_full
def test_horovod_mxnet2_suite_skips_itself_on_mxnet1(tmp_path):
    """test_mxnet2.py is MXNet 2.x's: on MXNet 1.x every test skips itself (none fails)."""
    _check(tmp_path, "test_mxnet2.py", "2hosts", passed=0)

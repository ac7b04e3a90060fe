"""DiLoCo in every plugin (issue 26): the digits MLP trained with DiLoCo, H = 20, float32
and int8 outer gradients, learns within 2 points of SyncPS in the same job, every rank
ending with identical parameters (tests/matrix.py's check, tests/scripts/matrix_job.py's
training loops: a Keras model for tensorflow, ``torch.optim.SGD`` for torch).

numpy runs in the default run (about 5 s); torch and tensorflow carry ``ci_full`` (about
20 s and 40 s on 2 cores): in the default run their H = 20 DiLoCo cell is one of the
feature matrix's sampled cells (torch's in tests/test_feature_matrix.py, MXNet's in
tests/test_mxnet_matrix.py; tensorflow's sampled cells are ``matrix_full``).  MXNet's own
job of these cells is tests/test_mxnet_diloco.py (``ci_full``).  All of them:
``pytest -m ci_full tests/test_diloco_plugins.py``.
"""
from __future__ import annotations

import pytest

import matrix

CELLS = [matrix.BASELINE, "diloco20/none/off", "diloco20/int8/off"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("plugin", [
    "numpy",
    pytest.param("torch", marks=pytest.mark.ci_full),
    pytest.param("tensorflow", marks=pytest.mark.ci_full)])
def test_diloco_h20_learns_digits_within_2_points_of_syncps(plugin, tmp_path):
    pytest.importorskip(plugin)
    ranks = matrix.check(plugin, "flat", tmp_path, CELLS, timeout=180)
    assert ranks[0]["diloco20/int8/off"]["steps"] == 600           # 30 rounds of 20

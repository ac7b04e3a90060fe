"""MXNet's rows of the feature matrix (tests/matrix.py); run in MXNet's own virtual
environment (`make test-mxnet`), skipped where MXNet is not installed."""
from __future__ import annotations

import pytest

import matrix

pytest.importorskip("mxnet")


def test_sampled_cells_flat(tmp_path):
    matrix.check("mxnet", "flat", tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
def test_sampled_cells(layout, tmp_path):
    matrix.check("mxnet", layout, tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
def test_whole_matrix(layout, tmp_path):
    matrix.check("mxnet", layout, tmp_path, matrix.cells(), timeout=1800)

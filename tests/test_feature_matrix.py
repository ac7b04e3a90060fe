"""The feature matrix (issue 24, tests/matrix.py): every combination of plugin, algorithm,
compression, local reduction and join learns the digits MLP within 2 points of SyncPS with
consistent ranks, or is refused by one rule of docs/compatibility.md.

The sampled form (every value of every axis once) runs for numpy and torch in every CI;
the whole matrix (all 24 cells per plugin and layout) carries the ``slow`` mark, which
``make test`` (and so .ci/run) still runs.  MXNet's rows are in tests/test_mxnet_matrix.py
(its own virtual environment).
"""
from __future__ import annotations

import pytest

import matrix

PLUGINS = ("numpy", "torch", "tensorflow")


def _need(plugin):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "tensorflow": "tensorflow"}[plugin])


@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", ("numpy", "torch"))
def test_sampled_cells(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.sampled(), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", PLUGINS)
def test_whole_matrix(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.cells())

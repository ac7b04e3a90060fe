"""The feature matrix (issue 24, tests/matrix.py): every combination of plugin, algorithm,
compression, local reduction and join learns the digits MLP within 2 points of SyncPS with
consistent ranks, or is refused by one rule of docs/compatibility.md.

What CI runs (``make test``, under its 30-minute budget):
- the whole cross product (30 cells: 5 algorithms x 3 compressions x 2 joins) for the
  numpy plugin, flat and under local reduction at the same time (``slow``): the core decides every stage,
  so this is where a combination breaks;
- the sampled cells (every value of every axis at least once) for torch and for MXNet
  (tests/test_mxnet_matrix.py, its own venv), flat; each plugin's own compose tests
  (tests/test_compose_*.py) cover its adaptation under local reduction.
The rest carries the ``matrix_full`` mark: the whole cross product and the sampled cells of
torch, tensorflow and MXNet in both layouts (5 min for torch and tensorflow on 2 cores,
5 for MXNet): ``pytest -m matrix_full tests/test_feature_matrix.py``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import matrix


def _need(plugin):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "tensorflow": "tensorflow"}[plugin])


@pytest.mark.slow
def test_whole_matrix_numpy(tmp_path):
    """Both layouts at once: each job keeps about one core busy, and CI has two."""
    with ThreadPoolExecutor(len(matrix.LAYOUTS)) as pool:
        runs = {layout: pool.submit(matrix.check, "numpy", layout, tmp_path, matrix.cells())
                for layout in matrix.LAYOUTS}
    failed = [f"{layout}: {run.exception()}" for layout, run in runs.items()
              if run.exception() is not None]
    assert not failed, "\n\n".join(failed)


def test_sampled_cells_torch(tmp_path):
    _need("torch")
    matrix.check("torch", "flat", tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", ("torch", "tensorflow"))
def test_sampled_cells(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", ("torch", "tensorflow"))
def test_whole_matrix(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.cells(), timeout=1800)

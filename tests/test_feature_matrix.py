"""The feature matrix (issue 24, tests/matrix.py): every combination of plugin, algorithm,
compression, local reduction and join learns the digits MLP within 2 points of SyncPS with
consistent ranks, or is refused by one rule of docs/compatibility.md.

What CI runs (``make test``, under its 30-minute budget), as three jobs at once:
- the whole cross product (30 cells: 5 algorithms x 3 compressions x 2 joins) for the
  numpy plugin under local reduction (2 hosts x 2: local stage and servers; ``slow``): the
  core decides every stage, so this is where a combination breaks;
- the sampled cells (every value of every axis at least once) for numpy and torch, flat,
  for numpy with server replication (2 servers, each the other's backup), and for MXNet (tests/test_mxnet_matrix.py, its own venv); each plugin's own compose
  tests (tests/test_compose_*.py) cover its adaptation under local reduction.
The rest carries the ``matrix_full`` mark: the whole cross product of numpy, torch and
tensorflow and the sampled cells of torch, tensorflow and MXNet in both layouts
(about 5 min for torch and tensorflow on 2 cores, 5 for MXNet):
``pytest -m matrix_full tests/test_feature_matrix.py``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import matrix


def _need(plugin):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "tensorflow": "tensorflow"}[plugin])


@pytest.mark.slow
def test_matrix_numpy_whole_and_torch_sampled(tmp_path):
    """Three jobs at once (each keeps about one of CI's two cores busy, and waits on the
    others' rounds the rest of the time): numpy's whole cross product under local
    reduction (2 hosts x 2), numpy's sampled cells flat, and torch's sampled cells flat.
    About 90 s on a quiet machine; the 600 s limit is for a loaded one, and a cell that
    hangs fails its job after matrix_job.py's ``STUCK_S`` with every rank's stack."""
    _need("torch")
    jobs = {("numpy", "local", "whole"): matrix.cells(),
            ("numpy", "flat", "sampled"): matrix.sampled(),
            ("torch", "flat", "sampled"): matrix.sampled()}
    with ThreadPoolExecutor(len(jobs)) as pool:
        runs = {job: pool.submit(matrix.check, job[0], job[1], tmp_path / "-".join(job),
                                 cells, timeout=600)
                for job, cells in jobs.items()}
    failed = [f"{'/'.join(job)}: {run.exception()}" for job, run in runs.items()
              if run.exception() is not None]
    assert not failed, "\n\n".join(failed)


def test_sampled_cells_with_server_replication(tmp_path):
    """Server replication (BYTEPS_SERVER_REPLICAS=1: 2 servers, each the other's backup)
    is an axis too: the sampled cells, numpy, 2 hosts x 2.  AsyncPS with compression hung
    here: its exact seed push is raw on a compressed key, which the backup refused
    ("compression differs from the declaration"), so the primary waited for its copy."""
    matrix.check("numpy", "replicas", tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", ("torch", "tensorflow"))
def test_sampled_cells(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.sampled(), timeout=600)


@pytest.mark.matrix_full
@pytest.mark.parametrize("layout", list(matrix.LAYOUTS))
@pytest.mark.parametrize("plugin", ("numpy", "torch", "tensorflow"))
def test_whole_matrix(plugin, layout, tmp_path):
    _need(plugin)
    matrix.check(plugin, layout, tmp_path, matrix.cells(), timeout=1800)

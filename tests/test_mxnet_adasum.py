"""Adasum in the MXNet plugin (runs in .venv-mxnet): DistributedTrainer with
algorithm=bps.algorithms.Adasum() (each rank's SGD step from the broadcast parameters,
the changes combined by Adasum) and allreduce(op=bps.Adasum)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

pytest.importorskip("mxnet")
pytestmark = pytest.mark.timeout(180)


def test_trainer_with_the_adasum_algorithm(tmp_path):
    from byteps.core.collective import adasum
    res = run_script("mx_adasum.py", tmp_path, workers=2, servers=1, timeout=150)
    assert_ok(res)
    got = read_results(tmp_path)
    assert got[0]["after"] == got[1]["after"]
    for k in ("weight", "bias"):
        start = np.array(got[0]["start"][k], np.float32)
        deltas = [(-0.5 * np.array(got[r]["grads"][k], np.float32) / 4).ravel()
                  for r in range(2)]
        want = start + adasum.tree(deltas).reshape(start.shape)
        np.testing.assert_allclose(got[0]["after"][k], want, rtol=1e-5, atol=1e-6)
    rows = [np.array(got[r]["mine"], np.float32) for r in range(2)]
    assert got[0]["sum"] == got[1]["sum"] == adasum.tree(rows).tolist()

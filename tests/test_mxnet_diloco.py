"""DiLoCo in MXNet (issue 26; tests/test_diloco_plugins.py for the other plugins): the
digits MLP, H = 20, float32 and int8 outer gradients, within 2 points of SyncPS in the
same job.  Run in MXNet's own virtual environment, skipped where MXNet is not installed.
``ci_full`` (about 30 s on 2 cores): `make test-mxnet` runs the H = 20 float32 cell as one
of the feature matrix's sampled cells (tests/test_mxnet_matrix.py); this job adds int8:
``.venv-mxnet/bin/python -m pytest -m ci_full tests/test_mxnet_diloco.py``."""
from __future__ import annotations

import pytest

import matrix

pytest.importorskip("mxnet")


@pytest.mark.ci_full
@pytest.mark.timeout(200)
def test_diloco_h20_learns_digits_within_2_points_of_syncps(tmp_path):
    ranks = matrix.check("mxnet", "flat", tmp_path,
                         [matrix.BASELINE, "diloco20/none/off", "diloco20/int8/off"],
                         timeout=180)
    assert ranks[0]["diloco20/int8/off"]["steps"] == 600

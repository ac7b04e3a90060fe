"""lr-aware error feedback in byteps.numpy (tests/scripts/numpy_lr_ef.py): the learning
rate given with bps.set_compression_lr scales the error-feedback residual."""
import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script


@pytest.mark.timeout(200)
def test_set_compression_lr_scales_the_residual(tmp_path):
    res = run_script("numpy_lr_ef.py", tmp_path, workers=2, servers=1, timeout=150,
                     BYTEPS_MIN_COMPRESS_BYTES=0)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    for rank in (0, 1):
        const, halved = (np.array(out[rank][k]) for k in ("const", "halved"))
        assert np.array_equal(const[0], halved[0])          # round 1: no residual yet
        assert not np.allclose(const[1], halved[1])         # round 2: residual x 2
    assert out[0] == out[1]                                 # every rank gets the same sum

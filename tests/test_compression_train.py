"""2 workers train the digits MLP with every compressor, in every plugin (issue 11).

One job per plugin trains once in float32 and once per compressor (error feedback
and compressor momentum where the original BytePS recommends them); every tensor is
compressed (BYTEPS_MIN_COMPRESS_BYTES=0).  Each compressed run must reach the
float32 run's test accuracy within 2 points, with identical weights on both ranks.
MXNet runs in its own environment: tests/test_mxnet_compression.py.
"""
import os

import pytest

from conftest import assert_ok, read_results, run_script

pytestmark = pytest.mark.timeout(400)


def check_training(tmp_path, plugin, timeout=300, **env):
    res = run_script("compress_train.py", tmp_path, plugin, workers=2, servers=1,
                     timeout=timeout, BYTEPS_MIN_COMPRESS_BYTES=0, **env)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    base = out[0]["float32"]["acc"]
    assert base > 0.9, out[0]
    for cname, run in out[0].items():
        assert run["digest"] == out[1][cname]["digest"], f"{plugin} {cname}: ranks differ"
        assert run["acc"] >= base - 0.02, f"{plugin} {cname}: {run['acc']:.4f} vs {base:.4f}"
    return out


@pytest.mark.parametrize("plugin", ["numpy", "torch"])
def test_compressed_training(tmp_path, plugin):
    pytest.importorskip(plugin)
    check_training(tmp_path, plugin)


@pytest.mark.parametrize("plugin", ["tensorflow", pytest.param("keras", marks=pytest.mark.ci_full)])
def test_compressed_training_tensorflow(tmp_path, plugin):
    pytest.importorskip("tensorflow")
    check_training(tmp_path, plugin, timeout=360)


def check_qadam(tmp_path, script, timeout):
    """QAdam trains as accurately as Adam, ranks end equal, and after warm-up the momentum
    travels at about 1/32 of its float32 bytes (onebit + error feedback)."""
    res = run_script(script, tmp_path, workers=2, servers=1, timeout=timeout)
    assert_ok(res)
    out = read_results(tmp_path)
    assert out[0]["qadam"][1] == out[1]["qadam"][1], "ranks differ"
    assert out[0]["qadam"][0] >= out[0]["adam"][0] - 0.02, out[0]
    mb = out[0]["momentum_bytes"]
    assert mb and mb["pushed_wire"] * 25 < mb["pushed"], mb


def test_qadam_torch(tmp_path):
    """bps.QAdamOptimizer with DistributedOptimizer, 20 warm-up steps."""
    pytest.importorskip("torch")
    check_qadam(tmp_path, "torch_qadam.py", 200)


def test_qadam_keras(tmp_path):
    """byteps.keras.QAdamOptimizer (Keras 3, model.fit), 20 warm-up steps."""
    pytest.importorskip("tensorflow")
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        pytest.skip("QAdamOptimizer needs Keras 3")
    check_qadam(tmp_path, "keras_qadam.py", 300)

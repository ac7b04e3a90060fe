"""The original BytePS's tensorflow2_keras_mnist.py pattern: a lazily built Sequential.

Its variables only exist after the first batch; BroadcastGlobalVariablesCallback must
broadcast them then (Keras 3 and tf-keras), and MetricAverageCallback(device=...) and
LearningRateWarmupCallback(warmup_epochs=3, initial_lr=..., verbose=1) work as there.
The same jobs check the timeline window of a Keras fit (steps from the gradient exchange).
"""
import collections
import importlib.util
import json

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed (pip install -e '.[tensorflow]')",
                allow_module_level=True)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf-keras"])
def test_lazily_built_model_gets_broadcast(tmp_path, legacy):
    if legacy == "1" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf-keras is not installed (pip install tf-keras==2.21.0)")
    out, traces = tmp_path / "out", tmp_path / "traces"
    out.mkdir()
    res = run_script("tf_keras_lazy.py", out, workers=2, servers=1, timeout=300,
                     TF_USE_LEGACY_KERAS=legacy, BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=traces,
                     BYTEPS_TRACE_START_STEP=2, BYTEPS_TRACE_END_STEP=3)
    assert_ok(res)
    a, b = (read_results(out)[r] for r in (0, 1))
    assert a["keras"].startswith("tf_keras" if legacy == "1" else "keras")
    # every rank started from its own random weights: identical only through the broadcast
    assert a["n_weights"] == 8 and a["digest"] == b["digest"], (a["checksum"], b["checksum"])
    assert a["opt_digest"] == b["opt_digest"]
    assert a["iterations"] == 16
    # MetricAverageCallback: the logged metrics are the same on both ranks
    assert a["logs"] == b["logs"] and all("accuracy" in e for e in a["logs"])
    # warm-up from 0.002 / 2 to 0.002 over 3 epochs, as in the original example
    np.testing.assert_allclose(a["lrs"], [0.001 * (1 + k / 3) for k in (1, 2, 3)] + [0.002],
                               rtol=1e-5)
    assert res.stdout.count("Epoch 3: finished gradual learning rate warmup to 0.002.") == 2
    # the timeline window 2..3 holds exactly two steps' gradients (8 variables each)
    for rank in (0, 1):
        doc = json.loads((traces / str(rank) / "comm.json").read_text())
        tensors = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "tensor"]
        assert collections.Counter(e["args"]["step"] for e in tensors) == {2: 8, 3: 8}
        assert all(e["name"].startswith("DistributedAdam.Push_Pull.") for e in tensors)

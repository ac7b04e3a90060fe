"""TensorFlow 2 / Keras 3 plugin tests (2 workers, real servers).

TF takes seconds to import, so one job (tests/scripts/tf_checks.py) runs all
Keras 3 checks and each test below inspects its results; a second job runs
the tf-keras (TF_USE_LEGACY_KERAS=1) checks.
"""
import importlib.util

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

# find_spec, not import: TensorFlow loads only in the worker processes
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed (pip install -e '.[tensorflow]')",
                allow_module_level=True)

TOL = 1e-5
pytestmark = pytest.mark.timeout(600)     # the module fixture's job runs inside the first test


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf")
    assert_ok(run_script("tf_checks.py", out, workers=2, servers=1, timeout=400))
    r = read_results(out)
    assert sorted(r) == [0, 1]
    return r


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf-keras is not installed (pip install tf-keras==2.21.0)")
    out = tmp_path_factory.mktemp("tflegacy")
    assert_ok(run_script("tf_legacy_checks.py", out, workers=2, servers=1, timeout=300,
                         TF_USE_LEGACY_KERAS="1"))
    r = read_results(out)
    assert sorted(r) == [0, 1]
    return r


def get(res, check):
    out = []
    for rank in (0, 1):
        v = res[rank][check]
        assert "error" not in v, f"rank {rank}, check {check}:\n{v.get('error')}"
        out.append(v)
    return out


@pytest.mark.parametrize("check", ["tape_eager", "tape_function"])
def test_tape_matches_single_process_on_concatenated_batch(res, check):
    a, b = get(res, check)
    assert a["rel"] < TOL and b["rel"] < TOL
    assert a["w"] == b["w"]          # bit-identical on every rank


def test_push_pull_and_broadcast(res):
    for v in get(res, "push_pulls"):
        assert v["sum"] == v["sum_fn"] == [3.0] * 3
        assert v["avg"] == v["avg_fn"] == [1.5] * 3
        assert v["int_avg"] == [1, 7]
        assert v["scalar_sum"] == 1.0 and v["scalar_shape"] == []
        # IndexedSlices are gathered: rank 0's one row, then rank 1's two rows
        assert v["sparse_indices"] == [0, 1, 1]
        assert v["sparse_values"] == [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
        assert v["fp16_dtype"] == "float32"
        np.testing.assert_allclose(v["fp16"], [2.25, -3.375], rtol=1e-3)
        assert v["bcast"] == [1, 11]


def test_broadcast_variables(res):
    a, b = get(res, "broadcast_vars")
    assert a["rel"] == 0.0 and b["rel"] == 0.0      # rank 1's initial weights everywhere
    assert a["flag"] is False and b["flag"] is False
    assert a["w_fn"] == b["w_fn"]


def test_embedding_sparse_and_dense(res):
    for v in get(res, "embeddings"):
        assert v["ref_kind"] == "IndexedSlices"
        assert v["sparse_kind"] == "IndexedSlices"    # not silently densified
        assert v["dense_kind"] != "IndexedSlices"     # sparse_as_dense=True
        assert v["rel_sparse"] < TOL and v["rel_dense"] < TOL and v["rel_sparse_eager"] < TOL
        assert v["moved"] > 1e-3


def test_keras_fit_callbacks(res):
    a, b = get(res, "keras_fit")
    assert a["w"] == b["w"]                   # broadcast + averaged gradients
    assert a["opt_class"] == "SGD" and a["is_sgd"]
    assert a["iterations"] == 6
    # warm-up over 2 epochs from 0.05 / 2: 0.0375 after epoch 1, 0.05 after epoch 2
    np.testing.assert_allclose(a["lrs"], [0.0375, 0.05], rtol=1e-6)
    assert abs(a["lr"] - 0.05) < 1e-6
    for epoch in range(2):
        assert a["post"][epoch] == b["post"][epoch]
        for key in ("loss", "mae"):
            mean = (a["pre"][epoch][key] + b["pre"][epoch][key]) / 2
            assert a["pre"][epoch][key] != b["pre"][epoch][key]
            assert abs(a["post"][epoch][key] - mean) < 1e-6 * abs(mean)


def test_keras_apply_and_backward_passes(res):
    for v in get(res, "keras_apply"):
        assert v["rel_one"] < TOL and v["rel_passes"] < TOL
        assert v["iterations"] == 4      # every backward pass counts (Horovod), 2 applied


def test_keras_local_variables_and_compute_gradients(res):
    """PartialDistributedOptimizer / register_local_var and compute_gradients (Horovod's)."""
    for v in get(res, "keras_local_vars"):
        assert v["local"] < TOL and v["shared"] < TOL and v["applied"] < TOL, v


def test_v1_optimizer(res):
    for v in get(res, "v1"):
        assert v["rel"] < TOL


def test_load_model_wraps_optimizer(res):
    a, b = get(res, "load_model")
    assert a["class"] == "Adam" and a["is_adam"] and a["distributed"]
    assert a["slots_rel"] == 0.0
    assert a["w"] == b["w"]


def test_api_errors(res):
    for v in get(res, "api_errors"):
        assert "either average= or op=" in v["op_and_average"]
        assert "use Average, Sum, Min, Max or Product" in v["bad_op"]
        assert "already a byteps DistributedOptimizer" in v["double_wrap"]
        assert "backward_passes_per_step=2" in v["v1_passes"]
        assert "root_rank=2 is out of range" in v["bad_root"]
        assert "dtype complex128 is not supported" in v["bad_dtype"]
        assert "broadcast_variables" in v["global_vars_eager"]
        assert "got object" in v["not_optimizer"]


def test_mismatched_shapes_raise_the_core_error(res):
    for rank in (0, 1):
        v = res[rank]["mismatch"]
        for mode in ("eager", "function"):
            msg = v[mode]
            assert "every rank must push the same shape" in msg, msg
            assert "(3,)" in msg and "(4,)" in msg


def test_legacy_tf_keras(legacy):
    a, b = get(legacy, "tape")
    assert legacy[0]["keras"].startswith("tf_keras") and legacy[0]["bk_keras"].startswith("tf_keras")
    assert a["opt_vars_is_method"]
    assert a["rel"] < TOL and a["w"] == b["w"]
    fa, fb = get(legacy, "fit")
    assert fa["w"] == fb["w"] and fa["slots"] == fb["slots"]
    assert fa["iterations"] == 6 and abs(fa["lr"] - 0.05) < 1e-6
    np.testing.assert_allclose(fa["lrs"], [0.0375, 0.05], rtol=1e-6)
    assert abs(fa["momentum"] - 0.5) < 1e-7       # momentum correction restored
    for epoch in range(2):
        assert fa["post"][epoch] == fb["post"][epoch]
        mean = (fa["pre"][epoch]["loss"] + fb["pre"][epoch]["loss"]) / 2
        assert abs(fa["post"][epoch]["loss"] - mean) < 1e-6 * mean

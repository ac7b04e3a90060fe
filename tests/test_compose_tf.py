"""TensorFlow and Keras compose with the core's features (tests/scripts/tf_compose.py):
an asynchronous DistributedGradientTape (BYTEPS_ENABLE_ASYNC=1) that does not hold a fast
worker to a straggler's pace, QAdam under Keras 3 and tf-keras 2 (DistributedOptimizer and
DistributedGradientTape), and lr-aware error feedback."""
import importlib.util

import pytest
from conftest import assert_ok, read_results, run_script

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed (pip install -e '.[tensorflow]')",
                allow_module_level=True)


def job(tmp_path, part, timeout=300, **env):
    res = run_script("tf_compose.py", tmp_path, part, workers=2, servers=1, timeout=timeout,
                     **env)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    return out


@pytest.mark.timeout(400)
def test_async_tape_is_not_held_to_a_stragglers_pace(tmp_path):
    out = job(tmp_path, "async", BYTEPS_ENABLE_ASYNC=1)
    fast, slow = out[0], out[1]
    # rank 1 sleeps 0.1 s per step (6.9 s over its 69 steps); rank 0 does the same work
    # without sleeping: held to rank 1's pace it would take as long
    slept = slow["sleep"] * slow["steps"]
    assert slow["loop_s"] >= slept
    assert fast["loop_s"] < slow["loop_s"] - 0.6 * slept, (fast["loop_s"], slow["loop_s"])
    for mode in ("eager", "function"):
        a, b = fast[mode], slow[mode]
        assert a["digest"] == b["digest"], mode          # identical after bps.finish()
        assert a["acc"] > 0.8, (mode, a)               # 3 epochs (SyncPS: ~0.9)
    assert fast["eager"]["loss"] < 0.3 * fast["loss0"]
    assert fast["function"]["loss"] < 0.3 * fast["function"]["loss0"]


@pytest.mark.timeout(500)
# in CI: tf-keras here (fit and the tape); Keras 3's fit: test_compression_train's qadam
@pytest.mark.parametrize("legacy", [pytest.param("0", marks=pytest.mark.ci_full), "1"],
                         ids=["keras3", "tf-keras"])
def test_qadam_trains_in_fit_and_in_the_tape(tmp_path, legacy):
    if legacy == "1" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf-keras is not installed (pip install tf-keras==2.21.0)")
    out = job(tmp_path, "qadam", timeout=400, TF_USE_LEGACY_KERAS=legacy,
              BYTEPS_MIN_COMPRESS_BYTES=0)
    a, b = out[0], out[1]
    assert a["keras"].startswith("tf_keras" if legacy == "1" else "keras")
    for key in ("fit", "tape_eager", "tape_function"):
        assert a[key]["digest"] == b[key]["digest"], key     # averaged: ranks agree
        assert a[key]["acc"] > 0.8, (key, a[key])           # from ~0.1; 4 epochs
        # past the 10 warm-up steps: 4 epochs of 750 rows (fit: 24 batches, loop: 23)
        assert a[key]["iterations"] == 4 * (24 if key == "fit" else 23)
    assert a["fit"]["class"] == "QAdamOptimizer"
    # after warm-up the momenta were exchanged (compressed) by both the fit and the tape
    assert any(k.startswith("fitQAdam.Push_Pull.QAdam.exp_avg.") for k in a["momentum_names"])
    assert any(k.startswith("DistributedGradientTape.Push_Pull.QAdam.exp_avg.")
               for k in a["momentum_names"])


@pytest.mark.timeout(400)
def test_lr_aware_error_feedback_gets_the_optimizers_learning_rate(tmp_path):
    out = job(tmp_path, "lr", BYTEPS_MIN_COMPRESS_BYTES=0)
    def lrs(seen):            # one learning rate per step over all pipelines of the tensor
        assert all(len(s) == 1 for s in seen), seen
        return [s[0] for s in seen]
    for rank in (0, 1):
        v = out[rank]
        assert lrs(v["pipes_lr"]["keras"]) == pytest.approx([0.5, 0.25, 0.125])
        assert lrs(v["pipes_lr"]["tape"]) == pytest.approx([0.4, 0.2, 0.1])
        assert lrs(v["function_lr"]) == pytest.approx([0.3, 0.03])

"""byteps.torch in real multi-process jobs (bpslaunch --standalone on loopback)."""
from __future__ import annotations

import re
import sys

import pytest
from conftest import ROOT, assert_ok, read_results, run_job, run_script

pytest.importorskip("torch")

PHASES = ["sgd", "adam", "bpps2", "fp16", "ddp", "unused", "fp16_ints", "autograd"]


def _same_on_all_ranks(res: dict, workers: int, key: str) -> dict:
    assert sorted(res) == list(range(workers)), f"missing ranks: {sorted(res)}"
    first = res[0][key]
    for r in range(1, workers):
        assert res[r][key] == first, f"{key}: rank {r} differs from rank 0"
    return first


@pytest.mark.timeout(90)
def test_training_equals_single_process_w2(tmp_path):
    """SGD-momentum, Adam, backward_passes_per_step=2, fp16, DDP+no_sync, an unused
    parameter, integer tensors under fp16, autograd through push_pull: 2 workers vs one
    process on the whole batch."""
    assert_ok(run_script("torch_train_equiv.py", tmp_path, *PHASES, workers=2, servers=2,
                         timeout=80))
    res = read_results(tmp_path)
    for ph in ("sgd", "adam", "bpps2", "ddp"):
        r0 = _same_on_all_ranks(res, 2, ph)
        assert r0["err"] < 1e-5, f"{ph}: relative error {r0['err']:.2e} vs one process"
    fp16 = _same_on_all_ranks(res, 2, "fp16")
    assert fp16["err"] < 5e-3, f"fp16 compression drifted: {fp16['err']:.2e}"
    unused = _same_on_all_ranks(res, 2, "unused")
    assert unused["aux_grad"] == unused["expected"]
    ints = _same_on_all_ranks(res, 2, "fp16_ints")
    assert ints["int_dtype"] == "torch.int64"
    assert ints["ints"] == [3 * i for i in range(10)]     # summed exactly, not via fp16
    assert ints["float_dtype"] == "torch.float32"
    assert ints["float_err"] <= 1e-3 * ints["float_scale"]
    for r in (0, 1):
        assert res[r]["autograd"] == {"y_ok": True, "grad_ok": True}, res[r]["autograd"]


@pytest.mark.timeout(90)
def test_training_equals_single_process_w3(tmp_path):
    assert_ok(run_script("torch_train_equiv.py", tmp_path, "sgd", "adam", workers=3,
                         servers=1, timeout=80))
    res = read_results(tmp_path)
    for ph in ("sgd", "adam"):
        r0 = _same_on_all_ranks(res, 3, ph)
        assert r0["err"] < 1e-5, f"{ph}: relative error {r0['err']:.2e} vs one process"


@pytest.mark.timeout(90)
def test_broadcast_parameters_optimizer_state_and_objects(tmp_path):
    """SGD, Adam (wrapped), AdamW, RMSprop, Adagrad; root 0 with state vs empty others,
    and the last rank as an empty root; broadcast_object from both roots."""
    assert_ok(run_script("torch_broadcast_state.py", tmp_path, workers=3, servers=2,
                         timeout=80))
    res = read_results(tmp_path)
    for key in res[0]:
        _same_on_all_ranks(res, 3, key)
    assert res[0]["sgd/root0"]["nstate"] == 6 and res[0]["sgd/root2"]["nstate"] == 0


@pytest.mark.timeout(90)
def test_original_byteps_script_runs_unchanged(tmp_path):
    res = run_script("torch_original_style.py", "--epochs", 2, "--out", tmp_path, workers=2,
                     servers=1, timeout=80)
    assert_ok(res)
    out = read_results(tmp_path)
    _same_on_all_ranks(out, 2, "params")
    assert out[0]["final_loss"] < out[0]["first_loss"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("flags", [(), ("--use-adasum",)], ids=["average", "adasum"])
def test_horovod_script_runs_with_only_the_import_changed(tmp_path, flags):
    """Horovod's pytorch_mnist.py style, also with its --use-adasum (op=hvd.Adasum)."""
    res = run_script("torch_horovod_style.py", "--epochs", 2, "--out", tmp_path, *flags,
                     workers=2, servers=1, timeout=80)
    assert_ok(res)
    out = read_results(tmp_path)
    _same_on_all_ranks(out, 2, "params")
    _same_on_all_ranks(out, 2, "state")
    for r in (0, 1):
        assert out[r]["gather_ok"] and out[r]["objs"] == [{"rank": 0}, {"rank": 1}]
    assert out[0]["final_loss"] < out[0]["first_loss"]


@pytest.mark.timeout(90)
def test_async_training_with_the_original_api(tmp_path):
    """BYTEPS_ENABLE_ASYNC=1: servers hold the parameters; broadcasts still work; DDP refuses."""
    assert_ok(run_script("torch_async.py", tmp_path, workers=2, servers=1, timeout=80,
                         BYTEPS_ENABLE_ASYNC=1))
    res = read_results(tmp_path)
    _same_on_all_ranks(res, 2, "start")
    _same_on_all_ranks(res, 2, "params")
    for r in (0, 1):
        assert res[r]["obj_ok"]
        assert res[r]["loss"] < 0.05 * 204.5, res[r]        # 204.5: loss of a zero model
        assert "BYTEPS_ENABLE_ASYNC=1" in res[r]["refused"]
        assert "rule 'async-wrapper'" in res[r]["refused"]       # the core's one rule


@pytest.mark.timeout(120)
def test_digits_demo_reaches_95_percent():
    res = run_job([sys.executable, str(ROOT / "examples" / "torch" / "train_digits.py")],
                  workers=2, servers=2, timeout=110)
    assert_ok(res)
    accs = [float(a) for a in re.findall(r"test_acc=([0-9.]+)", res.stdout)]
    assert accs, res.stdout
    assert accs[-1] >= 0.95, res.stdout

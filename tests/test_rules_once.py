"""Every collective rule is decided once, in the core (issue 24): the same bad root rank,
bad op or dtype gives the same error text, and a bool (or int16) tensor the same result in
the same dtype, through byteps.numpy, byteps.torch, byteps.tensorflow (and byteps.mxnet
where its venv runs this file); and no plugin source re-grows a rule of its own.  A real
2-worker job checks the bool rule (uint8 on the wire, reduced logically) across ranks."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_ok, run_job

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ["byteps/torch", "byteps/tensorflow", "byteps/mxnet", "byteps/numpy", "byteps/keras",
           "byteps/_keras"]


# ------------------------------------------------------------------ each plugin, one process
def _front(bps, conv, out, reducescatter=None) -> dict:
    return {"np": conv, "out": out, "bps": bps, "allreduce": bps.allreduce,
            "broadcast": bps.broadcast, "allgather": bps.allgather,
            "reducescatter": reducescatter or bps.reducescatter}


def _numpy():
    import byteps.numpy as bps
    return _front(bps, np.asarray, np.asarray)


def _torch():
    torch = pytest.importorskip("torch")
    import byteps.torch as bps
    return _front(bps, lambda a: torch.from_numpy(np.array(a)), lambda t: t.numpy())


def _tensorflow():
    tf = pytest.importorskip("tensorflow")
    import byteps.tensorflow as bps
    return _front(bps, lambda a: tf.constant(np.array(a)), lambda t: t.numpy())


def _mxnet():
    mx = pytest.importorskip("mxnet")
    import byteps.mxnet as bps

    def conv(a):
        a = np.array(a)
        return mx.nd.array(a, dtype=a.dtype)
    return _front(bps, conv, lambda t: t.asnumpy(),
                  lambda t, op=None: bps.reducescatter(t, op=op))


FRONTS = {"numpy": _numpy, "torch": _torch, "tensorflow": _tensorflow, "mxnet": _mxnet}


@pytest.fixture(scope="module")
def job():
    from byteps.core import api
    api.init()
    yield
    api.shutdown()


def _error(fn) -> tuple[str, str]:
    """(the error's kind, its text with generated tensor names made neutral)."""
    try:
        fn()
    except (ValueError, TypeError) as exc:
        kind = "ValueError" if isinstance(exc, ValueError) else "TypeError"
        return kind, re.sub(r"'[\w.]*noname[\w.]*'", "'<name>'", str(exc))
    return "no error", ""


def _behaviour(front: str) -> dict:
    p = FRONTS[front]()
    bps, t, out = p["bps"], p["np"], p["out"]
    res = {
        "bad root": _error(lambda: p["broadcast"](t([1.0, 2.0]), 5)),
        "bool root": _error(lambda: p["broadcast"](t([1.0]), True)),
        "reducescatter max": _error(lambda: p["reducescatter"](t([[1.0], [2.0]]), op=bps.Max)),
        "adasum int": _error(lambda: p["allreduce"](t(np.array([1, 2], np.int32)),
                                                    op=bps.Adasum)),
        "reducescatter adasum": _error(lambda: p["reducescatter"](t([[1.0], [2.0]]),
                                                                  op=bps.Adasum)),
        "adasum value": out(p["allreduce"](t(np.array([1.0, 2.0], np.float32)),
                                           op=bps.Adasum)).tolist(),
        "average and op": _error(lambda: p["allreduce"](t([1.0]), average=True, op=bps.Sum)),
    }
    if front != "mxnet":          # mxnet's NDArrays hold no complex dtype
        res["complex allreduce"] = _error(lambda: p["allreduce"](
            t(np.array([1 + 2j], np.complex64)), name="c"))
    flags = [True, False, True]
    for what, fn in (("bool sum", lambda: p["allreduce"](t(flags), op=bps.Sum)),
                     ("bool average", lambda: p["allreduce"](t(flags))),
                     ("bool min", lambda: p["allreduce"](t(flags), op=bps.Min)),
                     ("bool broadcast", lambda: p["broadcast"](t(flags), 0)),
                     ("bool allgather", lambda: p["allgather"](t([flags]))),
                     ("int16 sum", lambda: p["allreduce"](t(np.array([300, -7], np.int16)),
                                                          op=bps.Sum)),
                     ("0-d broadcast", lambda: p["broadcast"](t(np.float32(2.5)), 0))):
        try:
            r = out(fn())
        except KeyError:              # a dtype the framework has no tensor of (mxnet int16)
            continue
        res[what] = [r.dtype.name, list(r.shape), r.tolist()]
    return res


@pytest.mark.parametrize("front", ["torch", "tensorflow", "mxnet"])
def test_plugins_share_the_cores_rules(job, front):
    want = _behaviour("numpy")
    got = _behaviour(front)
    for case, value in want.items():
        if case not in got:
            continue
        assert got[case] == value, f"{front} {case}: {got[case]} != numpy's {value}"


def test_the_rules_are_the_expected_ones(job):
    got = _behaviour("numpy")
    assert got["bad root"] == ("ValueError", "broadcast: root_rank=5 is out of range for a "
                               "job of 1 worker(s); use 0..0")
    assert got["bool root"][0] == "ValueError"
    assert got["reducescatter max"] == ("ValueError", "reducescatter: op=hvd.Max is not "
                                        "supported; use Average or Sum (as Horovod)")
    assert got["adasum int"][0] == "ValueError" and "op=Adasum takes float16, float32 or " \
        "float64 tensors (as Horovod), got int32" in got["adasum int"][1]
    assert "op=Adasum is not supported for reducescatter" in got["reducescatter adasum"][1]
    assert got["adasum value"] == [1.0, 2.0]        # one rank: its own tensor
    assert "either average= or op=" in got["average and op"][1]
    assert got["complex allreduce"][0] == "TypeError"
    assert "'c'" in got["complex allreduce"][1] and "complex64" in got["complex allreduce"][1]
    for case in ("bool sum", "bool average", "bool min", "bool broadcast"):
        assert got[case] == ["bool", [3], [True, False, True]], case
    assert got["bool allgather"] == ["bool", [1, 3], [[True, False, True]]]
    assert got["int16 sum"] == ["int16", [2], [300, -7]]
    assert got["0-d broadcast"] == ["float32", [], 2.5]


def test_torch_push_pull_uses_the_same_bool_rule(job):
    torch = pytest.importorskip("torch")
    import byteps.torch as bps
    x = torch.tensor([True, False])
    r = bps.push_pull(x, name="rules.bool")
    assert r.dtype == torch.bool and r.tolist() == [True, False]


# ------------------------------------------------------------------ no plugin re-grows a rule
RULES = {   # what a plugin must not contain -> where the rule lives
    r"out of range for": "byteps/core/collective/rules.py check_root",
    r"\.noname\.|noname\.\{": "byteps/core/collective/rules.py auto_name",
    r"use (hvd\.)?Average or (hvd\.)?Sum|bps\.Average or bps\.Sum": "byteps/core/collective/"
                                                                     "rules.py resolve_op",
    r"give either": "byteps/core/collective/rules.py resolve_op",
    r"np\.zeros_like\(|\.zero_\(\)": "byteps/core/pipeline/pushpull.py broadcast_async",
    r"(torch|tf|np)\.(bool|int16|uint16|uint32|bfloat16)\s*:\s*(torch|tf|np)\.":
        "byteps/core/collective/carry.py",
    r"np\.dtype\((bool|np\.int16|np\.uint16|np\.uint32)\)\s*:": "byteps/core/collective/carry.py",
    r"def (_?check_root|_?auto_name|_scatter_op|resolve_average)\(":
        "byteps/core/collective/rules.py",
}


def test_no_plugin_decides_a_rule_of_its_own():
    found = []
    for folder in PLUGINS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for pattern, home in RULES.items():
                for m in re.finditer(pattern, text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r} "
                                 f"(the rule lives in {home})")
    assert not found, "plugins re-decide core rules:\n" + "\n".join(found)


def test_the_core_defines_each_rule_once():
    core = ROOT / "byteps" / "core"
    defs: dict[str, list[str]] = {}
    for path in sorted(core.rglob("*.py")):
        for m in re.finditer(r"^def (check_root|resolve_op|auto_name|wire_dtype|carry)\(",
                             path.read_text(), re.M):
            defs.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    assert defs == {"check_root": ["byteps/core/collective/ops.py",
                                   "byteps/core/collective/rules.py"],
                    "resolve_op": ["byteps/core/collective/rules.py"],
                    "auto_name": ["byteps/core/collective/rules.py"],
                    "wire_dtype": ["byteps/core/collective/carry.py"],
                    "carry": ["byteps/core/collective/carry.py"]}, defs
    # collectives.check_root only fills in this job's size: one wording, in rules.py
    assert "out of range" not in (core / "collective" / "ops.py").read_text()


# ------------------------------------------------------------------ across ranks
JOB = r"""
import json, os, sys
import numpy as np
import torch
import byteps.numpy as bnp
import byteps.torch as bt
bt.init()
r = bt.rank()
mine = [[True, False, False], [True, True, False]][r]
out = {
    "numpy sum": bnp.allreduce(np.array(mine), op=bnp.Sum).tolist(),
    "numpy min": bnp.allreduce(np.array(mine), op=bnp.Min).tolist(),
    "numpy gather": bnp.allgather(np.array([mine])).tolist(),
    "torch sum": bt.allreduce(torch.tensor(mine), op=bt.Sum).tolist(),
    "torch product": bt.allreduce(torch.tensor(mine), op=bt.Product).tolist(),
    "torch push_pull": bt.push_pull(torch.tensor(mine), name="pp.bool").tolist(),
    "torch bcast": bt.broadcast(torch.tensor(mine), 1).tolist(),
    "dtypes": [str(bt.allreduce(torch.tensor(mine)).dtype),
               bnp.allreduce(np.array(mine)).dtype.name],
}
try:
    bt.broadcast(torch.ones(2), 2)
except ValueError as e:
    out["bad root"] = str(e)
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(out, f)
bt.shutdown()
"""


def test_bool_rule_across_two_workers(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "bool_job.py"
    script.write_text(JOB)
    res = run_job([__import__("sys").executable, str(script), str(tmp_path)], workers=2,
                  servers=1, timeout=150, BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        any_, all_ = [True, True, False], [True, False, False]
        assert got["numpy sum"] == got["torch sum"] == got["torch push_pull"] == any_
        assert got["numpy min"] == got["torch product"] == all_
        assert got["numpy gather"] == [[True, False, False], [True, True, False]]
        assert got["torch bcast"] == [True, True, False]
        assert got["dtypes"] == ["torch.bool", "bool"]
        assert got["bad root"] == ("broadcast: root_rank=2 is out of range for a job of 2 "
                                   "worker(s); use 0..1")

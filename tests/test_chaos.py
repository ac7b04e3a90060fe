"""The chaos harness's CI form: a few seeded faults on small jobs (benchmarks/chaos.py).

Every run must survive with the right parameters or end with an error that names the
fault: no hang, no silent wrong result, no process or /dev/shm file left behind.  The
long form (``pytest -m chaos_full tests/test_chaos.py``, or ``benchmarks/chaos.py
--faults 300``) draws every fault kind, with freezes up to 30 s."""
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _check(out):
    import json
    runs = json.loads((out / "chaos.json").read_text())["runs"]
    for r in runs:
        assert r["outcome"] in ("survived", "right error"), r
        assert not r["leftover_pids"] and not r["leftover_shm"], r
    return runs


def test_seeded_faults_end_correctly(tmp_path):
    # 2 faults (CI time): a worker killed in training and a worker that raises mid-step
    rc = chaos.main(["--faults", "2", "--seed", "5", "--kinds", "kill-worker,raise",
                     "--out", str(tmp_path)])
    runs = _check(tmp_path)
    assert rc == 0, runs


@pytest.mark.chaos_full
def test_twenty_seeded_faults_of_every_kind(tmp_path):
    rc = chaos.main(["--faults", "20", "--seed", "1", "--max-freeze", "12",
                     "--out", str(tmp_path)])
    _check(tmp_path)
    assert rc == 0

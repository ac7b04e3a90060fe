"""The scheduler's deadlock detection: ranks blocked in different collectives fail within
seconds, naming each other, without BYTEPS_COLLECTIVE_TIMEOUT_S; the job goes on after
shutdown() and init().  Slow but busy ranks never trip it (tests/scripts/deadlock_*.py)."""
from __future__ import annotations

import pytest
from conftest import assert_ok, read_results, run_script

from byteps.scheduler.deadlock import parse


@pytest.mark.timeout(90)
@pytest.mark.parametrize("framework", [
    "numpy", pytest.param("torch", marks=pytest.mark.ci_full)])   # the same core path
def test_ranks_in_different_collectives_fail_naming_each_other(tmp_path, framework):
    """Rank 0 in allreduce 'a', rank 1 in broadcast 'b': both raise CollectiveDeadlockError
    (a CollectiveTimeoutError) within seconds naming both, then 20 collectives succeed.
    Before that, rank 0 computes for 3.5 s while rank 1 waits: no deadlock."""
    if framework == "torch":
        pytest.importorskip("torch")
    res = run_script("deadlock_worker.py", tmp_path, framework, workers=2, servers=1,
                     timeout=75)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    for r, doc in out.items():
        assert "CollectiveTimeoutError" in doc["mro"], doc
        assert doc["type"] == "CollectiveDeadlockError", doc
        text = doc["error"]
        assert "deadlock" in text and "rank 0 waits in allreduce 'a'" in text, text
        assert "rank 1 waits in broadcast 'b'" in text, text
        assert "shutdown() and init()" in text, text
        assert doc["took"] < 10, doc
        assert doc["bad"] == [], doc
        assert doc["slow"] == 2.0, doc


@pytest.mark.ci_full          # the same detection; the barrier's own wait marker
@pytest.mark.timeout(90)
def test_a_rank_in_a_barrier_and_one_in_a_collective(tmp_path):
    res = run_script("deadlock_worker.py", tmp_path, "numpy", "barrier", workers=2, servers=1,
                     timeout=75)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    for r, doc in out.items():
        assert doc["type"] == "CollectiveDeadlockError", doc
        assert "rank 0 waits in barrier 'barrier." in doc["error"], doc
        assert "rank 1 waits in broadcast 'b'" in doc["error"], doc
        assert doc["took"] < 10 and doc["bad"] == [], doc


def test_blocked_reports_are_validated_field_by_field():
    ok = {"names": ["allreduce 'a'"], "s": 2.5, "started": ["allreduce 'a'"], "sets": False}
    assert parse({"blocked": ok})["names"] == ("allreduce 'a'",)
    assert parse({"step": 3}) is None
    for bad in ({"names": "allreduce 'a'"}, {"names": []}, {"names": [1]},
                {"names": ["x" * 301]}, {"s": -1}, {"s": True}, {"s": "2"},
                {"started": ["x"] * 257}, {"sets": 0}):
        with pytest.raises(ValueError):
            parse({"blocked": dict(ok, **bad)})
    with pytest.raises(ValueError):
        parse({"blocked": ["allreduce 'a'"]})

"""Unnamed calls realign at every init() of a rank already in the job (the core's
naming rule, byteps/core/collective/rules.py auto_name): Horovod's suites call init() at
the start of every test without shutdown(), and a test one rank left early must not shift
the names of every later test (tests/scripts/noname_init.py, 2 workers)."""
from __future__ import annotations

from tests.conftest import assert_ok, read_results, run_script


def test_unnamed_calls_realign_at_init(tmp_path):
    res = run_script("noname_init.py", tmp_path, workers=2, timeout=120,
                     BYTEPS_COLLECTIVE_TIMEOUT_S="20")
    assert_ok(res)
    got = read_results(tmp_path)
    assert sorted(got) == [0, 1] and all(v["rounds"] == 20 for v in got.values())
    # the generation after the second init() is in the names, the same on both ranks
    assert got[0]["names"] == got[1]["names"] and "i1." in got[0]["names"][0]

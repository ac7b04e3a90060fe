"""init() of a rank already in the job: unnamed calls realign (the core's
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


def test_init_after_a_peer_left_forms_the_group_anew(tmp_path):
    """A rank whose collective failed because another rank left the membership (the
    servers' error carries that) joins the re-formed group at its next init(), within
    seconds, instead of staying in the old one while the other waits in init() until the
    job ends (tests/scripts/peer_left_init.py, 2 workers)."""
    res = run_script("peer_left_init.py", tmp_path, workers=2, timeout=120)
    assert_ok(res)
    got = read_results(tmp_path)
    assert "left the job" in got[0]["failed"] and "rank 1" in got[0]["failed"], got[0]
    assert got[0]["reinit_s"] < 15 and got[1]["reinit_s"] < 20, got

"""Issue 24: ranks that re-use a name with *different* new shapes at the same call get one
error naming the tensor, both shapes and both ranks, at once (not the servers' stall
warnings); ranks that agree are unaffected, also with several new layouts in flight and
across join() (byteps/core/pipeline/redeclare.py)."""
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_ok, read_results, run_job

from byteps.core.pipeline import redeclare

pytestmark = pytest.mark.timeout(180)


def _run(tmp_path, mode):
    return run_job([sys.executable, str(SCRIPTS / "redeclare_job.py"), str(tmp_path), mode],
                   workers=2, servers=2, timeout=120, BYTEPS_ENABLE_IPC=0)


def test_different_new_shapes_fail_every_rank_at_once(tmp_path):
    res = _run(tmp_path, "mismatch")
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stdout + res.stderr
    for r, o in out.items():
        err = o["error"]
        assert err is not None, (r, o)
        for part in ("'x'", "rank 0 pushed shape (3,) float32",
                     "rank 1 pushed shape (4,) float32"):
            assert part in err, (r, err)
        assert o["seconds"] < 10, (r, o["seconds"])        # not a stall
        assert o["again"] == err, (r, o["again"])


def test_ranks_that_agree_on_new_shapes_train_through_join(tmp_path):
    res = _run(tmp_path, "agree")
    assert_ok(res)
    out = read_results(tmp_path)
    assert {o["last"] for o in out.values()} == {0}
    for r, o in out.items():
        steps = [1 + 2 if s < 3 else 1 if s < 5 else 3 for s in range(7)]
        want = [[float(w * (s + 1))] * 5 for s, w in enumerate(steps)
                if r == 0 or s < 3 or s >= 5]
        assert o["sums"] == want, (r, o["sums"])


def test_mismatch_message_names_each_rank_and_skips_joined_ones():
    rows = np.zeros((3, redeclare._FIELDS), np.int64)
    rows[0] = redeclare._encode((3,), 0)
    rows[2] = redeclare._encode((2, 2), 0)
    msg = redeclare.mismatch("w", rows)
    assert msg.startswith("tensor 'w': rank 0 pushed shape (3,) float32 but rank 2 pushed "
                          "shape (2, 2) float32 at the same call"), msg
    rows[2] = rows[0]
    assert redeclare.mismatch("w", rows) is None
    long = tuple(range(1, 12))
    rows[2] = redeclare._encode(long, 4)
    assert "(1, 2, 3, 4, 5, 6, 7, ...) int64" in redeclare.mismatch("w", rows)

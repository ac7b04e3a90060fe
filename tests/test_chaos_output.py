"""A failure prints one block per cause and names the first cause last.

A shape mismatch under 4 workers reaches every rank: the rank the server's message
names prints its traceback (ending at the user's line), the others one line, and
bpslaunch's last line is the error itself.  (The per-worker summary lines are counted
apart.)"""
import sys

import pytest

from conftest import SCRIPTS, run_job


@pytest.mark.parametrize("layout", [("--hosts", "4"), ()], ids=["4-hosts", "np4-local"])
def test_a_four_worker_shape_mismatch_prints_one_block(layout, tmp_path):
    """``-np 4`` alone is one host of 4 local ranks (local reduction): the ranks whose shape
    differs from the shared buffer say why in one line each, the buffer's creator prints
    the one traceback; at most 15 lines in all, summaries included."""
    res = run_job([sys.executable, str(SCRIPTS / "shape_mismatch.py")], workers=4, servers=1,
                  timeout=90, launcher_args=layout or ("--local-size", "4"),
                  BYTEPS_ENABLE_IPC=0)
    assert res.returncode == 1, res.stderr[-3000:]
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) <= 15, "\n".join(lines)
    assert sum("Traceback (most recent call last)" in x for x in lines) == 1, "\n".join(lines)
    assert not any("/byteps/" in x and "File " in x for x in lines), "\n".join(lines)
    assert not any(" 0 push_pull(s)" in x for x in lines), "\n".join(lines)
    last = lines[-1]
    assert last.startswith("bpslaunch: job failed; root cause: "), last
    if layout:      # a server compares the declarations
        assert "tensor 'g': rank" in last and "shape (11,) float32" in last, last
    else:           # the local ranks compare their shared buffer
        assert "tensor 'g': local rank" in last and " x float32" in last, last
        assert "see their log" not in last, last        # the cause, not a rank it failed

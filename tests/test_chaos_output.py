"""A failure prints one block per cause and names the first cause last.

A shape mismatch under 4 workers reaches every rank: the rank the server's message
names prints its traceback (ending at the user's line), the others one line, and
bpslaunch's last line is the error itself.  (The per-worker summary lines are counted
apart.)"""
import sys

from conftest import SCRIPTS, run_job


def test_a_four_worker_shape_mismatch_prints_one_block(tmp_path):
    res = run_job([sys.executable, str(SCRIPTS / "shape_mismatch.py")], workers=4, servers=1,
                  timeout=90, launcher_args=("--hosts", "4"), BYTEPS_ENABLE_IPC=0)
    assert res.returncode == 1, res.stderr[-3000:]
    lines = (res.stdout + res.stderr).strip().splitlines()
    summaries = [x for x in lines if " push_pull(s), " in x]
    assert len(lines) - len(summaries) <= 15, "\n".join(lines)
    assert sum("Traceback (most recent call last)" in x for x in lines) == 1, "\n".join(lines)
    assert not any("/byteps/" in x and "File " in x for x in lines), "\n".join(lines)
    last = lines[-1]
    assert last.startswith("bpslaunch: job failed; root cause: "), last
    assert "tensor 'g': rank" in last and "shape (11,) float32" in last, last

"""Names re-used across join()s under local reduction (issue 24: the feature matrix's
decentralized cell after an uneven join hung in ``average_now``'s ``#contributors``).

Every cell ends with ``average_now`` under the same prefix (as every algorithm's
``finish()`` does); one local rank of each host is held inside ``join()`` while the other
already averages again under the re-used names.  Fails (a stall, or a joined rank
failing a tensor) when a joined rank adds zeros to operations after every local rank
of its host joined, or when rounds of a re-used name drift across the join."""
import sys

import pytest

from conftest import SCRIPTS, read_results, run_job


@pytest.mark.parametrize("laggard", [0, 1])
def test_names_reused_across_joins_under_local_reduction(tmp_path, laggard):
    res = run_job([sys.executable, str(SCRIPTS / "join_reuse.py"), str(tmp_path),
                   str(laggard), "1.5"], workers=4, servers=1, timeout=180,
                  launcher_args=("--hosts", "2", "--local-size", "2"),
                  BYTEPS_STALL_WARNING_S=10)
    ranks = read_results(tmp_path)
    assert res.returncode == 0 and len(ranks) == 4, (res.stdout[-3000:], res.stderr[-5000:])
    want = [{"w": 10.0 + cell, "b": 1.5} for cell in range(4)]   # mean over the 4 ranks
    for r in range(4):
        assert ranks[r]["averages"] == want, (r, ranks[r])

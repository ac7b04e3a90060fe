"""Graph-mode collectives of byteps.tensorflow (tests/scripts/tf_graph_order.py) in a job of
2 workers: grouped and independent collectives run 50 times in a TF1 session with inter-op
parallelism, each rank's inputs late for a different half of them, so an unordered runtime
would start them in different orders (it deadlocks without byteps' ordering); the same in
a ``tf.function``; a run does the collectives of the ops it fetches only (those built
before it run in order, without theirs); Horovod's error classes from graph ops (FailedPreconditionError for a
mismatch between ranks, InvalidArgumentError for bad splits, NotImplementedError for
IndexedSlices with other ops), and collectives working after each error."""
from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from conftest import assert_ok, read_results, run_script  # noqa: E402


def test_graph_ops_complete_in_any_runtime_order(tmp_path):
    res = run_script("tf_graph_order.py", tmp_path, workers=2, timeout=120)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1]
    for r in (0, 1):
        for check in ("op built later runs after the earlier ones", "session FailedPreconditionError",
                      "session InvalidArgumentError", "session works after errors",
                      "function FailedPreconditionError", "IndexedSlices as Horovod",
                      "eager works after errors", "op built after a failed one works",
                      "one collective per fetched op", "autograph leaves byteps alone",
                      "BroadcastGlobalVariablesHook"):
            assert done[r].get(check) == 1, (r, check)
        assert done[r]["graph 50 runs"] > 0, done[r]    # finished (a deadlock hits the timeout)

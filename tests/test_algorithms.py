"""Issue 17: one async policy in the core, bounded staleness, the algorithm interface
(docs/algorithms.md).  Real multi-process jobs, each with a timeout."""
import json

import numpy as np
import pytest

from conftest import assert_ok, read_results, run_script

NOIPC = {"BYTEPS_ENABLE_IPC": 0}


@pytest.mark.timeout(90)
def test_numpy_async_push_pull_of_deltas_and_average_error(tmp_path):
    assert_ok(run_script("algo_numpy.py", tmp_path, "deltas", workers=2, servers=2,
                         timeout=80, BYTEPS_ENABLE_ASYNC=1, **NOIPC))
    out = read_results(tmp_path)
    for r in (0, 1):
        assert out[r]["value"] == [9.0] * 4          # 3 pushes of 1 + 3 pushes of 2
        err = out[r]["error"]
        assert "'avg'" in err and "average=True" in err and "average=False" in err
        assert out[r]["bcast"] == [6.0] * 3 and out[r]["bcast2"] == [7.0] * 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["sync", "async", "average"])
def test_numpy_algorithms_train_digits(tmp_path, algo):
    env = dict(NOIPC, **({"BYTEPS_ENABLE_ASYNC": 1} if algo == "async" else {}))
    assert_ok(run_script("algo_numpy.py", tmp_path, "train", algo, workers=2, servers=1,
                         timeout=110, **env))
    out = read_results(tmp_path)
    assert out[0]["digest"] == out[1]["digest"]       # every rank ends identical
    assert out[0]["acc"] > 0.82, out[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("s", [0, 2])
def test_bounded_staleness_is_never_exceeded(tmp_path, s):
    rec = tmp_path / "rec"
    assert_ok(run_script("algo_numpy.py", tmp_path, "stale", 20, workers=3, servers=1,
                         timeout=110, BYTEPS_ENABLE_ASYNC=1, BYTEPS_ASYNC_STALENESS=s,
                         BYTEPS_TEST_RECORD=rec, **NOIPC))
    stats = [json.loads(p.read_text()) for p in tmp_path.glob("rec.staleness.*.json")]
    assert stats and all(st["max_lag"] <= s for st in stats), stats
    assert sum(st["held"] for st in stats) > 0       # the slow rank did hold pulls
    out = read_results(tmp_path)
    n = 3
    for r, o in out.items():
        for k, v in enumerate(o["vals"]):       # every other rank pushed round k - s
            assert v >= (k + 1) + (n - 1) * max(0, k - s + 1), (r, k, o["vals"])
    if s == 0:                                   # synchronous: identical on every rank
        assert all(o["vals"] == [3.0 * (k + 1) for k in range(20)] for o in out.values())


@pytest.mark.timeout(90)
def test_staleness_zero_equals_synchronous(tmp_path):
    assert_ok(run_script("algo_numpy.py", tmp_path, "same", workers=2, servers=2, timeout=80,
                         BYTEPS_ENABLE_ASYNC=1, BYTEPS_ASYNC_STALENESS=0, **NOIPC))
    for o in read_results(tmp_path).values():
        assert o["async"] == o["sync"]


def test_staleness_store_unit():
    """The server's hold rule without sockets."""
    from byteps.server.staleness import AsyncStore
    from byteps.server.store import Slot
    from byteps.transport.wire import ASYNC, PULL, PUSH, Entry
    st = AsyncStore(1)
    slot = Slot(1, 0, 0, 2, -1)
    out = {}
    one = np.ones(2, np.float32)
    for rnd in range(3):                         # rank 0 runs ahead of rank 1
        st.apply(slot, Entry(1, 0, rnd, PUSH | PULL | ASYNC, 0, 2), one, 0, b"a", {0, 1}, out)
    assert len(out.get(b"a", [])) == 1           # round 0 answered; 1, 2 held (rank 1 at -1)
    st.apply(slot, Entry(1, 0, 0, PUSH | PULL | ASYNC, 0, 2), one, 1, b"b", {0, 1}, out)
    assert len(out[b"a"]) == 2 and len(out[b"b"]) == 1     # round 1 of rank 0 released
    assert st.stats["max_lag"] <= 1
    st.apply(slot, Entry(1, 0, 1, PUSH | PULL | ASYNC, 0, 2), one, 1, b"b", {0, 1}, out)
    assert len(out[b"a"]) == 3 and out[b"a"][-1][1].tolist() == [5.0, 5.0]


def test_async_and_model_average_single_process():
    """No servers: async push_pull keeps the value locally; errors are clear."""
    import byteps.numpy as bps
    bps.init()
    try:
        from byteps.core import api
        assert api.push_pull(np.ones(2), "loc", average=False, asynchronous=True).tolist() \
            == [1.0, 1.0]
        assert api.push_pull(np.ones(2), "loc", average=False, asynchronous=True).tolist() \
            == [2.0, 2.0]
        with pytest.raises(bps.BytePSError, match="average=True"):
            api.push_pull(np.ones(2), "loc2", average=True, asynchronous=True)
        with pytest.raises(bps.BytePSError, match="keeps its mode"):
            api.push_pull(np.ones(2), "loc", average=False)
        with pytest.raises(TypeError, match="Algorithm"):
            bps.DistributedOptimizer(lambda p, g: None, {"w": np.ones(2)}, algorithm="x")
    finally:
        bps.shutdown()


def test_torch_async_model_average_single_process():
    """torch DistributedOptimizer(algorithm=AsyncModelAverage): rounds run in the
    background, abort()/resume(), finish(); a wrong algorithm is a TypeError."""
    torch = pytest.importorskip("torch")
    import time

    import byteps.torch as bps
    bps.init()
    try:
        m = torch.nn.Linear(4, 1)
        alg = bps.algorithms.AsyncModelAverage(sync_interval_ms=10)
        opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                       named_parameters=m.named_parameters(), algorithm=alg)
        for _ in range(30):
            opt.zero_grad()
            m(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            time.sleep(0.005)
        alg.abort()
        alg.resume()
        opt.finish()
        assert alg.rounds > 0 and not alg.thread.is_alive()
        with pytest.raises(TypeError, match="algorithm"):
            bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), algorithm="x")
    finally:
        bps.shutdown()

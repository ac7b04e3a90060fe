"""MXNet join() (Horovod semantics) and the original's suspend()/resume(): runs in the
MXNet venv (``make test`` runs ``.venv-mxnet/bin/python -m pytest tests/test_mxnet*.py``;
MXNet 1.9.1 needs numpy<1.24, so the main venv skips this file).

Ranks with uneven steps call join(); every rank's parameters equal a one-process replay
in which, at each step, the ranks that still have data add their gradients and the
joined ranks add zeros (the average still divides by the number of workers).
"""
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_ok, read_results, run_job

mx = pytest.importorskip("mxnet", reason="MXNet runs in .venv-mxnet (make test-mxnet)")

STEPS = [3, 5, 8]
B, LR = 4, 0.1


def _replay(w0: np.ndarray, b0: np.ndarray, upto: int, active_only: bool = False):
    """Plain numpy: per step, sum over ranks with data of d(sum_i |xW^T + b - y|^2)/B,
    divided by the number of workers (``active_only``: by the ranks with data, wrong)."""
    w, b = w0.astype(np.float64), b0.astype(np.float64)
    for s in range(upto):
        gw, gb = np.zeros_like(w), np.zeros_like(b)
        for r, n in enumerate(STEPS):
            if s < n:
                rng = np.random.RandomState(1000 * r + s)
                x, y = rng.randn(B, 8).astype(np.float32), rng.randn(B, 3).astype(np.float32)
                d = 2 * (x @ w.T + b - y)
                gw += d.T @ x / B
                gb += d.sum(axis=0) / B
        n = sum(s < k for k in STEPS) if active_only else len(STEPS)
        w -= LR * gw / n
        b -= LR * gb / n
    return w, b


@pytest.mark.timeout(200)
def test_mxnet_join_uneven_steps_equal_the_replay_with_zeros(tmp_path):
    res = run_job([sys.executable, str(SCRIPTS / "mx_join.py"), str(tmp_path),
                   ",".join(map(str, STEPS))], workers=len(STEPS), servers=1, timeout=180,
                  BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2]
    mx.random.seed(0)
    ref = mx.gluon.nn.Dense(3, in_units=8)
    ref.initialize(mx.init.Xavier())                       # rank 0's initial values
    w0 = ref.weight.data().asnumpy()
    b0 = ref.bias.data().asnumpy()
    for kind in ("trainer", "optimizer"):
        assert {o[kind]["last"] for o in out.values()} == {2}, kind
        for r, o in out.items():
            w, b = _replay(w0, b0, STEPS[r])      # a rank's model stops at its join()
            got_w = np.array(o[kind]["params"]["weight"])
            got_b = np.array(o[kind]["params"]["bias"])
            assert np.allclose(got_w, w, atol=1e-5), (kind, r, np.abs(got_w - w).max())
            assert np.allclose(got_b, b, atol=1e-5), (kind, r, np.abs(got_b - b).max())
        # joined ranks count as zeros, not as absent (the test tells the two apart)
        w_wrong = _replay(w0, b0, STEPS[2], active_only=True)[0]
        assert not np.allclose(np.array(out[2][kind]["params"]["weight"]), w_wrong, atol=1e-3)


def test_mxnet_join_is_the_core_join_and_one_process_returns_rank_0():
    import byteps.mxnet as bps
    from byteps.core import api
    assert bps.join is api.join and "join" in bps.__all__
    bps.init()                      # one process, no DMLC_*: local, join() returns rank 0
    try:
        assert bps.join() == 0 and bps.join(device=-1) == 0
    finally:
        bps.shutdown()


def test_suspend_and_resume_in_a_running_job():
    """The original BytePS's ``byteps.mxnet.suspend()`` (and ``resume()``) in the middle
    of training: tests/test_elastic.py's check, for MXNet."""
    r = run_job([sys.executable, str(SCRIPTS / "suspend_resume.py"), "mxnet"], workers=2,
                servers=2, timeout=150)
    assert_ok(r)
    out = r.stdout + r.stderr
    assert out.count("RESULT ") == 2 and out.count("shutdown: rank() refused") == 2, out[-3000:]
    assert "dropped connection" not in out

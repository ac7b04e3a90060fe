"""One worker does no communication (Horovod's ``-np 1``) but keeps the API and checks:
every algorithm's steps and finish(), push_pull/broadcast/collectives/join and the
per-name checks, in a local job inside the test process (no sockets, no engine).  The
same through ``bpslaunch -np 1``: tests/test_user_day_one.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import byteps.numpy as bps
from byteps.core import api

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def local_job(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("DMLC_", "BYTEPS_")):
            monkeypatch.delenv(k)
    bps.init()
    assert bps.size() == 1 and api._STATE.engine is None
    yield
    bps.shutdown()


def _sgd(params, grads):
    for n, g in grads.items():
        params[n] -= 0.1 * g


@pytest.mark.parametrize("make", [
    lambda: bps.algorithms.SyncPS(),
    lambda: bps.algorithms.AsyncModelAverage(sync_interval_ms=10),
    lambda: bps.algorithms.DiLoCo(inner_steps=2, outer_lr=1.0, outer_momentum=0.0),
    lambda: bps.algorithms.Decentralized(),
    lambda: bps.algorithms.AsyncPS(),
], ids=["SyncPS", "AsyncModelAverage", "DiLoCo", "Decentralized", "AsyncPS"])
def test_every_algorithm_trains_like_plain_sgd(make):
    w = np.ones(5, np.float32)
    ref = w.copy()
    opt = bps.DistributedOptimizer(_sgd, {"w": w}, algorithm=make())
    for i in range(4):
        g = np.full(5, float(i + 1), np.float32)
        opt.step({"w": g})
        ref -= 0.1 * g
    opt.finish()
    np.testing.assert_allclose(w, ref, rtol=1e-6, atol=1e-6)


def test_common_calls_and_their_checks():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(bps.push_pull(x, name="a"), x)              # the average of one
    assert np.array_equal(bps.push_pull(x, name="s", average=False), x)
    assert np.array_equal(bps.broadcast(x, root_rank=0, name="b"), x)
    assert np.array_equal(bps.allgather(x, name="g"), x)
    assert np.array_equal(bps.allreduce(x, name="r", op=bps.Sum), x)
    assert bps.broadcast_object({"k": (1, 2)}) == {"k": (1, 2)}
    bps.barrier()
    assert bps.join() == 0
    with pytest.raises(bps.BytePSError, match="differs from its first use"):
        bps.push_pull(x, name="a", compression_params={"compressor": "fp16"})
    with pytest.raises(ValueError, match="root"):
        bps.broadcast(x, root_rank=1, name="b2")               # no rank 1 in a job of one
    with pytest.raises(ValueError, match="tensor name"):
        bps.push_pull(x, name="")


def test_compression_asked_in_a_job_of_one_says_nothing_is_compressed():
    import logging
    lines = []

    class Rec(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    rec = Rec()
    logging.getLogger("byteps").addHandler(rec)
    try:
        for _ in range(2):
            g = np.ones(1 << 15, np.float32)
            assert np.array_equal(bps.push_pull(g, name="g", compression_params={
                "compressor": "int8"}), g)
            bps.step_done()
    finally:
        logging.getLogger("byteps").removeHandler(rec)
    said = [x for x in lines if x.startswith("compression:")]
    assert said == ["compression: nothing is compressed: this job has one worker, which "
                    "exchanges nothing (1 tensor(s) asked for compression)"], lines

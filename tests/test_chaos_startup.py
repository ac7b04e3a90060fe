"""Faults during an elastic job's start-up: a worker SIGKILLed before it registered.

``bpslaunch --min-workers 2 -np 3``: the job forms with the two live workers (the
minimum) and trains to the result of one process; when it cannot form (``--min-workers
3``), its last line names the killed worker, never a process that ended because another
one failed (exit code 86)."""
import sys

import numpy as np
from conftest import SCRIPTS, assert_ok, read_results, run_job


def _reference(steps):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((96, 40)).astype(np.float32)
    y = X @ rng.standard_normal(40).astype(np.float32)
    w = np.zeros(40, np.float32)
    for _ in range(steps):
        w -= np.float32(0.05) * (X.T @ (X @ w - y) / np.float32(96))
    return w


def _job(tmp_path, min_workers, **env):
    return run_job([sys.executable, str(SCRIPTS / "elastic_startup_kill.py"), str(tmp_path),
                    "host2", "20"], workers=3, servers=1, timeout=90,
                   launcher_args=("--min-workers", str(min_workers)),
                   BYTEPS_ENABLE_IPC=0, **env)


def test_elastic_job_forms_without_a_worker_killed_before_it_registered(tmp_path):
    res = _job(tmp_path, 2)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    assert all(o["size"] == 2 for o in out.values())
    np.testing.assert_allclose(out[0]["w"], _reference(20), rtol=1e-4, atol=1e-5)
    assert out[0]["w"] == out[1]["w"]
    assert "ended with signal SIGKILL; the elastic job goes on with 2 worker(s)" in res.stderr


def test_an_elastic_job_that_cannot_form_names_the_killed_worker(tmp_path):
    res = _job(tmp_path, 3, BYTEPS_STARTUP_TIMEOUT=2)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "root cause: worker rank 2" in last and "signal SIGKILL" in last, res.stderr[-3000:]
    assert "exit code 86" not in last, last


def test_a_cluster_elastic_job_forms_without_a_worker_that_never_registered(monkeypatch):
    """On a cluster no bpslaunch tells the scheduler that a worker died before it registered
    (benchmarks/chaos_cluster.py found the job ending after BYTEPS_STARTUP_TIMEOUT): with
    --min-workers registered and no other for min(BYTEPS_ELASTIC_TIMEOUT, half the start-up
    timeout), the job forms with them."""
    import time

    from test_elastic import _books, _close, _reg, _scheduler
    s = _scheduler(monkeypatch, workers=3)          # minimum 2
    s.elastic.timeout = 0.5                         # (BYTEPS_ELASTIC_TIMEOUT's least value)
    try:
        _reg(s, b"srv", "server", "s0", 10)
        _reg(s, b"w0", "worker", "host0", 100)
        s.maybe_form()
        time.sleep(0.6)
        s.maybe_form()
        assert not s.formed                         # one worker: below the minimum
        _reg(s, b"w1", "worker", "host1", 101)
        assert not s.formed                         # the third may still come
        time.sleep(0.6)
        s.maybe_form()
        assert s.formed and s.epoch == 1
        books = _books(s)
        assert {s.workers[i]["rank"] for i in s.workers} == {0, 1}
        assert all(b.get("size") == 2 for i, b in books.items() if i != b"srv"), books
    finally:
        _close(s)

"""Faults during an elastic job's start-up: a worker SIGKILLed before it registered.

``bpslaunch --min-workers 2 -np 3``: the job forms with the two live workers (the
minimum) and trains to the result of one process; when it cannot form (``--min-workers
3``), its last line names the killed worker, never a process that ended because another
one failed (exit code 86)."""
import sys

import numpy as np
from conftest import ROOT, SCRIPTS, assert_ok, read_results, run_job

sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos_job import reference  # noqa: E402  (the elastic scripts' least squares, one process)


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
    np.testing.assert_allclose(out[0]["w"], reference(20), rtol=1e-4, atol=1e-5)
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


def _role_job(tmp_path, hosts: int, victim: str, **extra):
    """A cluster job in role mode (one bpslaunch per role and host, as on real machines):
    the worker of host ``victim`` SIGKILLs itself before it registers.  Returns (return
    codes, outputs, seconds) of scheduler, server, worker hosts h0...; never hangs."""
    import os
    import subprocess
    import time

    from conftest import BPSLAUNCH, ROOT, job_env

    from byteps.launcher import free_port
    env = job_env(BYTEPS_JOB_ID=f"lost-{os.getpid()}-{time.monotonic_ns()}",
                  DMLC_NUM_WORKER=hosts, DMLC_NUM_SERVER=1, DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT=free_port(), BYTEPS_JOB_SECRET="lost-" + "cd" * 16,
                  BYTEPS_ENABLE_IPC=0, **extra)
    work = [sys.executable, str(SCRIPTS / "elastic_startup_kill.py"), str(tmp_path), victim,
            "20"]
    roles = [("scheduler", {}, []), ("server", {}, [])] + [
        ("worker", {"DMLC_WORKER_ID": str(i), "BYTEPS_EMULATED_HOST": f"h{i}"}, work)
        for i in range(hosts)]
    t0 = time.monotonic()
    procs = [subprocess.Popen(BPSLAUNCH + cmd, env=dict(env, DMLC_ROLE=role, **x), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role, x, cmd in roles]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, 100 - (time.monotonic() - t0)))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], outs, time.monotonic() - t0


def test_a_cluster_job_ends_at_once_naming_a_worker_killed_before_it_registered(tmp_path):
    """Role mode: the dead worker's bpslaunch tells the scheduler (Op.LOST), which ends the
    job with that cause long before BYTEPS_STARTUP_TIMEOUT (60 s here)."""
    rcs, outs, took = _role_job(tmp_path, 2, "h1", BYTEPS_STARTUP_TIMEOUT=60)
    text = "\n---\n".join(o[-2000:] for o in outs)
    assert took < 40, text                  # (the start-up timeout: 60 s)
    assert rcs[3] == 128 + 9 and rcs[0] != 0 and rcs[2] != 0, (rcs, text)
    want = "worker (DMLC_WORKER_ID=1, host 127.0.0.1, local rank 0) (pid "
    for i in (0, 2):            # the scheduler, and the job's last word on host h0
        assert want in outs[i] and "was killed by SIGKILL before the job formed" in outs[i], \
            text
    assert "registered after" not in text, text


def test_an_elastic_cluster_job_forms_at_once_without_a_worker_dead_before_it_registered(
        tmp_path):
    """Elastic (BYTEPS_MIN_WORKERS=2 of 3): formed as soon as the two others registered, not
    after min(BYTEPS_ELASTIC_TIMEOUT, half the start-up timeout) = 60 s."""
    rcs, outs, took = _role_job(tmp_path, 3, "h2", BYTEPS_MIN_WORKERS=2,
                                BYTEPS_ELASTIC_TIMEOUT=60, BYTEPS_STARTUP_TIMEOUT=120)
    text = "\n---\n".join(o[-2000:] for o in outs)
    assert rcs == [0, 0, 0, 0, 137], (rcs, text)
    assert took < 50, text
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1] and all(o["size"] == 2 for o in out.values()), text
    np.testing.assert_allclose(out[0]["w"], reference(20), rtol=1e-4, atol=1e-5)
    assert "before the job formed; it forms without it" in outs[0], text


def test_a_lost_report_is_checked_field_by_field():
    import pytest

    from byteps.scheduler.lost import check
    from byteps.transport.wire import WireError
    good = {"role": "worker", "host_id": "h1", "pid": 42, "what": "worker 1",
            "how": "was killed by SIGKILL"}
    assert check(dict(good, extra=1)) == good           # (unknown fields are not kept)
    for bad in ([], dict(good, role="scheduler"), dict(good, pid=-1), dict(good, pid=True),
                dict(good, pid="42"), dict(good, what=""), dict(good, what="x" * 301),
                dict(good, how="a\nb"), dict(good, host_id=7)):
        with pytest.raises(WireError):
            check(bad)


def test_a_restarted_scheduler_gives_a_node_whose_book_was_lost_its_place(monkeypatch):
    """The scheduler formed, sent REGISTER_OK and was killed before every book left: the
    new one gets the others back (resume) and this node afresh; it must get its first
    formation's rank and node id (it waited for a book until its start-up timeout)."""
    from test_elastic import _close, _reg, _scheduler

    from byteps.transport.wire import Op
    s = _scheduler(monkeypatch, workers=2, min=None)     # fixed size
    try:
        back = dict(resume={"node_id": 1, "rank": -1, "epoch": 1, "size": 2})
        _reg(s, b"srv", "server", "s0", 10, **back)
        _reg(s, b"w1", "worker", "host1", 101, worker_id=1,        # rank 1 got its book
             resume={"node_id": 3, "rank": 1, "epoch": 1, "size": 2})
        assert not s.formed
        _reg(s, b"w0", "worker", "host0", 100, worker_id=0)        # rank 0's was lost
        assert s.formed and s.epoch == 1
        books = {i: b for i, op, b in s.sent if op == Op.REGISTER_OK}
        assert list(books) == [b"w0"], s.sent                      # the others keep theirs
        b = books[b"w0"]
        assert (b["rank"], b["node_id"], b["size"], b["epoch"]) == (0, 2, 2, 1), b
        assert [(w["rank"], w["node_id"]) for w in b["workers"]] == [(0, 2), (1, 3)]
        assert [x["node_id"] for x in b["servers"]] == [1]
    finally:
        _close(s)


def test_a_registration_sent_twice_to_a_restarted_scheduler_is_one(monkeypatch):
    """A node sends REGISTER while no scheduler runs (ZeroMQ queues it) and again when its
    connection to the restarted scheduler comes back: the second, before formation, is a
    replay, not a second server at that address (that ended the job: test_restarts,
    standalone, found under load)."""
    import zmq
    from test_elastic import _close, _scheduler

    from byteps.transport.wire import Op, encode
    s = _scheduler(monkeypatch, workers=1, min=None)     # fixed size

    def register(ident, seq, role, pid, **kw):
        body = {"role": role, "host": "127.0.0.1", "host_id": f"h{pid}", "pid": pid,
                "hostname": "h", "machine": "m", "num_worker": 1, "num_server": 1,
                "local_rank": 0, "local_size": 1, "worker_id": 0, "replicas": 0,
                "address": "tcp://127.0.0.1:1" if role == "server" else None, **kw}
        s.handle([zmq.Frame(ident)] + [zmq.Frame(f) for f in encode(
            s.cfg.job_id, -1, Op.REGISTER, 0, seq, body, None)])
    try:
        register(b"srv", 5, "server", 10)
        register(b"srv", 6, "server", 10)          # the same node, sent again
        assert not [x for x in s.sent if x[1] == Op.REFUSED], s.sent
        register(b"w0", 5, "worker", 20)
        register(b"w0", 7, "worker", 20)
        assert s.formed and s.exit_code is None
        books = [i for i, op, _ in s.sent if op == Op.REGISTER_OK]
        assert sorted(books) == [b"srv", b"w0"], s.sent
    finally:
        _close(s)

"""The scheduler's deadlock detection: ranks blocked in different collectives fail within
seconds, naming each other, without BYTEPS_COLLECTIVE_TIMEOUT_S; the job goes on after
shutdown() and init().  Slow but busy ranks never trip it (tests/scripts/deadlock_*.py)."""
from __future__ import annotations

import pytest
from conftest import assert_ok, read_results, run_script

from byteps.scheduler.deadlock import parse


@pytest.mark.timeout(90)
@pytest.mark.parametrize("framework", [
    "numpy", pytest.param("torch", marks=pytest.mark.ci_full)])   # the same core path
def test_ranks_in_different_collectives_fail_naming_each_other(tmp_path, framework):
    """Rank 0 in allreduce 'a', rank 1 in broadcast 'b': both raise CollectiveDeadlockError
    (a CollectiveTimeoutError) within seconds naming both, then 20 collectives succeed.
    Before that, rank 0 computes for 3.5 s while rank 1 waits: no deadlock."""
    if framework == "torch":
        pytest.importorskip("torch")
    res = run_script("deadlock_worker.py", tmp_path, framework, workers=2, servers=1,
                     timeout=75)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    for r, doc in out.items():
        assert "CollectiveTimeoutError" in doc["mro"], doc
        assert doc["type"] == "CollectiveDeadlockError", doc
        text = doc["error"]
        assert "deadlock" in text and "rank 0 waits in allreduce 'a'" in text, text
        assert "rank 1 waits in broadcast 'b'" in text, text
        assert "shutdown() and init()" in text, text
        assert doc["took"] < 10, doc
        assert doc["bad"] == [], doc
        assert doc["slow"] == 2.0, doc


@pytest.mark.ci_full          # the same detection; the barrier's own wait marker
@pytest.mark.timeout(90)
def test_a_rank_in_a_barrier_and_one_in_a_collective(tmp_path):
    res = run_script("deadlock_worker.py", tmp_path, "numpy", "barrier", workers=2, servers=1,
                     timeout=75)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    for r, doc in out.items():
        assert doc["type"] == "CollectiveDeadlockError", doc
        assert "rank 0 waits in barrier 'barrier." in doc["error"], doc
        assert "rank 1 waits in broadcast 'b'" in doc["error"], doc
        assert doc["took"] < 10 and doc["bad"] == [], doc


def test_blocked_reports_are_validated_field_by_field():
    ok = {"names": ["allreduce 'a'"], "s": 2.5, "started": ["allreduce 'a'"], "sets": False}
    assert parse({"blocked": ok})["names"] == ("allreduce 'a'",)
    assert parse({"step": 3}) is None
    for bad in ({"names": "allreduce 'a'"}, {"names": []}, {"names": [1]},
                {"names": ["x" * 301]}, {"s": -1}, {"s": True}, {"s": "2"},
                {"started": ["x"] * 257}, {"sets": 0}):
        with pytest.raises(ValueError):
            parse({"blocked": dict(ok, **bad)})
    with pytest.raises(ValueError):
        parse({"blocked": ["allreduce 'a'"]})


def _formed(monkeypatch):
    """An in-process scheduler of a formed 2-worker job (test_elastic's fixture)."""
    from test_elastic import _scheduler
    s = _scheduler(monkeypatch, workers=2, min=None)
    for r in (0, 1):
        s.workers[b"w%d" % r] = {"rank": r, "node_id": 2 + r, "host": "h", "host_id": f"h{r}",
                                  "pid": r, "local_rank": 0}
    s.formed = True
    return s


def _beats(s, reps, t0, n=2):
    """Each worker sends ``n`` heartbeats, one interval apart, its report ``reps[rank]``."""
    import time
    for k in range(n):
        for r, b in reps.items():
            s.deadlocks.note(b"w%d" % r, {"report": {"blocked": dict(b, s=t0 + k * 1.0)}})
    return time.monotonic()


def _blocked(name, started, sets=False):
    return {"names": [name], "started": sorted(started), "sets": sets}


def test_the_rule_declares_only_what_cannot_go_on(monkeypatch):
    """The scheduler's rule, message by message: different calls deadlock; the same call
    (slow: every rank started it) does not, nor one rank busy, process sets, a joined rank,
    or one heartbeat only."""
    from byteps.transport.wire import Op
    s = _formed(monkeypatch)
    try:
        a, b = "allreduce 'a'", "broadcast 'b'"
        cases = [  # (reports by rank, heartbeats, declared?)
            ({0: _blocked(a, {a}), 1: _blocked(b, {b})}, 2, True),
            ({0: _blocked(a, {a}), 1: _blocked(b, {b})}, 1, False),        # one heartbeat
            ({0: _blocked(a, {a}), 1: _blocked(a, {a})}, 2, False),        # slow, same call
            ({0: _blocked(a, {a}), 1: _blocked(b, {a, b})}, 2, False),     # 1 started a too
            ({0: _blocked(a, {a})}, 2, False),                             # rank 1 computes
            ({0: _blocked(a, {a}, True), 1: _blocked(b, {b})}, 2, False),  # process sets
        ]
        for reps, n, want in cases:
            s.deadlocks.last.clear()
            s.deadlocks.declared_epoch, s.sent = None, []
            s.deadlocks.check(_beats(s, reps, 2.0, n))
            told = [x for x in s.sent if x[1] == Op.HEARTBEAT_ACK and "deadlock" in x[2]]
            assert bool(told) == want, (reps, n, s.sent)
            if want:
                assert len(told) == 2 and "rank 0 waits in allreduce 'a'" in told[0][2][
                    "deadlock"] and "rank 1 waits in broadcast 'b'" in told[0][2]["deadlock"]
        s.deadlocks.last.clear()
        s.deadlocks.declared_epoch, s.sent = None, []
        s.departures.joined[b"w1"] = 1            # a rank inside join(): zeros come from it
        s.deadlocks.check(_beats(s, {0: _blocked(a, {a}), 1: _blocked(b, {b})}, 2.0))
        assert not s.sent
    finally:
        from test_elastic import _close
        _close(s)


def test_a_name_this_rank_finished_counts_as_started():
    """A rank past a collective (its round completed) reports that name among the started
    ones, so ranks still waiting for the round's answer are slow, not deadlocked: a loaded CI
    run declared one when rank 1 had finished push_pull '#contributors' and waited in a
    barrier while ranks 0, 2 and 3 still waited for '#contributors' (the rule's row "1
    started a too" above then holds). A wait that failed is not a finished name."""
    import threading

    from byteps.core.engine import deadlock
    with deadlock.waiting(("handle", 1), "push_pull 'x'"):
        assert deadlock.current()[0] == ("handle", 1)
    assert deadlock.current() is None

    def other():
        with deadlock.waiting(("handle", 2), "allreduce 'y'"):
            pass
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    with pytest.raises(RuntimeError):
        with deadlock.waiting(("handle", 3), "push_pull 'z'"):
            raise RuntimeError("failed")
    done = deadlock.finished()
    assert "push_pull 'x'" in done and "allreduce 'y'" in done and "push_pull 'z'" not in done
    for i in range(deadlock.MAX_DONE + 5):
        with deadlock.waiting(("handle", 10 + i), f"push_pull 'n{i}'"):
            pass
    assert len(deadlock.finished()) == deadlock.MAX_DONE


@pytest.mark.timeout(90)
def test_a_rank_behind_the_others_init_fails_alone_and_stays(tmp_path):
    """Rank 0 leaves a phase after one unnamed call (a test that failed on it only) and calls
    init(); rank 1 waits in the phase's second call. Rank 1 gets CollectiveBehindError within
    seconds (no BYTEPS_COLLECTIVE_TIMEOUT_S), naming the call and rank 0, and stays: rank 0's
    wait in the next phase never fails, and 5 more phases of unnamed calls are right. Horovod's
    TensorFlow suite with 3 workers ended in re-formations without this."""
    res = run_script("behind_worker.py", tmp_path, workers=2, servers=1, timeout=75)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    assert out[0]["type"] == "NoneType" and out[0]["bad"] == [], out[0]
    doc = out[1]
    assert doc["type"] == "CollectiveBehindError" and "CollectiveTimeoutError" in doc["mro"], doc
    assert "allreduce.noname.e1j0i1.1" in doc["error"] and "rank(s) 0 never made" in \
        doc["error"] and "stays in the job" in doc["error"], doc
    assert doc["took"] < 15 and doc["bad"] == [] and doc["first"] == 2.0, doc
    assert "re-formed" not in res.stderr and "left the job" not in res.stderr.split(
        "called shutdown()")[0], res.stderr[-3000:]


def test_the_behind_rule_tells_only_the_rank_behind(monkeypatch):
    """The scheduler's "behind" rule, message by message: a rank that waits for 2 heartbeats
    (and BEHIND_S) in an unnamed call of an earlier generation than another rank's is told,
    alone; not when the later rank started that call, for a name the user gave, for a
    process set's call, while the ranks' epochs differ, or after one heartbeat."""
    from byteps.common.generation import given, of_name, tag
    from byteps.transport.wire import Op
    assert of_name("push_pull 'allreduce.noname.e1j0i2.7.0.meta.3x41'", 1) == (1, 0, 2)
    assert of_name("allreduce 'allreduce.noname.3'", 1) == (1, 0, 0)
    assert of_name("allreduce 'allreduce.noname.ps2.e4j1.0'", 4) == (4, 1, 0)
    assert of_name("allreduce 'grad.w'", 1) is None and tag(1, 0, 0) == "" and \
        tag(3, 0, 2) == "e3j0i2."
    # a name the user gave carries the generation once init() was called again in the job
    # (Horovod's suites reuse names across tests): never paired with an earlier test's call
    assert given("w", 1, 0, 0) == "w" and given("w", 1, 0, 2) == "w~e1j0i2"
    assert of_name("push_pull 'w~e1j0i2.0.meta'", 1) == (1, 0, 2)
    from byteps.scheduler.deadlock import parse_gen, parse_waits
    assert parse_gen({"gen": [1, 0, 2]}) == (1, 0, 2) and parse_gen({}) is None
    ok = {"names": [], "s": 0.0, "started": ["allreduce 'a'"]}
    assert parse_waits({"waits": ok})["started"] == {"allreduce 'a'"}
    for bad in ([1, 0], [1, 0, -1], [1, 0, True], "1,0,2", [1.0, 0, 2]):
        with pytest.raises(ValueError):
            parse_gen({"gen": bad})
    for bad in ({"names": "x"}, {"names": [1]}, {"s": -1}, {"s": "1"},
                {"started": ["x" * 301]}, {"names": ["x"] * 9}):
        with pytest.raises(ValueError):
            parse_waits({"waits": dict(ok, **bad)})
    s = _formed(monkeypatch)
    try:
        late = "push_pull 'allreduce.noname.e1j0i2.1'"
        cases = [  # (rank -> (gen, waits or None), heartbeats, ranks told)
            ({0: ((1, 0, 3), None), 1: ((1, 0, 2), [late])}, 2, [1]),
            ({0: ((1, 0, 3), None), 1: ((1, 0, 2), ["allreduce 'x~e1j0i2'"])}, 2, [1]),
            ({0: ((1, 0, 3), None), 1: ((1, 0, 2), [late], True)}, 2, []),  # process sets
            ({0: ((1, 0, 3), None), 1: ((1, 0, 2), [late])}, 1, []),
            ({0: ((1, 0, 3), [late]), 1: ((1, 0, 2), [late])}, 2, []),   # 0 started it
            ({0: ((1, 0, 2), None), 1: ((1, 0, 2), [late])}, 2, []),     # one generation
            ({0: ((2, 0, 0), None), 1: ((1, 0, 2), [late])}, 2, []),     # re-forming
            ({0: ((1, 0, 3), None), 1: ((1, 0, 2), ["allreduce 'w'"])}, 2, []),
            ({0: ((1, 0, 3), None),
              1: ((1, 0, 2), ["allreduce 'allreduce.noname.ps1.e1j0i2.0'"])}, 2, []),
        ]
        for reps, n, want in cases:
            s.deadlocks.gens.clear()
            s.deadlocks.told.clear()
            s.sent = []
            for k in range(n):
                for r, (gen, waits, *sets) in reps.items():
                    rep = {"gen": list(gen)}
                    if waits:
                        rep["waits"] = {"names": waits, "s": 4.0 + k, "started": waits,
                                        "sets": bool(sets)}
                    s.deadlocks.note(b"w%d" % r, {"report": rep})
            s.deadlocks.check(__import__("time").monotonic())
            told = [x for x in s.sent if x[1] == Op.HEARTBEAT_ACK and "behind" in x[2]]
            assert [x[0] for x in told] == [b"w%d" % r for r in want], (reps, n, s.sent)
            assert not [x for x in s.sent if "deadlock" in x[2]], s.sent
            if want:
                assert told[0][2]["gen"] == [1, 0, 3] and "rank(s) 0 never made" in \
                    told[0][2]["behind"], told
    finally:
        from test_elastic import _close
        _close(s)

"""Timeline (Chrome trace), push-pull telemetry and the launcher's per-worker summary."""
from __future__ import annotations

import json
import types

import pytest
from conftest import assert_ok, read_results, run_script

from byteps.common.summary import format_summary
from byteps.core.timeline import PushPullSpeed, StepCounter, Timeline, _lanes

STAGES = {"queue", "push", "server+pull", "copy_out", "server_sum (est.)"}


def _task(hid, part, nbytes, sent_at, out_bytes=1000):
    h = types.SimpleNamespace(id=hid, error=None, out=types.SimpleNamespace(nbytes=out_bytes))
    return types.SimpleNamespace(handle=h, part=part, nbytes=nbytes, server=0, sent_at=sent_at)


def test_speed_window_and_summary():
    s = PushPullSpeed(window_s=10.0)
    assert s.get(now=5.0)[1] == 0.0
    s.add(4_000_000, now=100.0)
    s.add(4_000_000, now=101.0)
    ts, mbps = s.get(now=102.0)
    assert ts > 1_600_000_000_000              # ms since the epoch
    assert mbps == pytest.approx(8.0 / 2.0)    # 8 MB over the 2 s since the oldest event
    assert s.get(now=200.0)[1] == 0.0          # everything left the 10 s window
    s.op_done(0.5)
    doc = s.summary()
    assert doc["push_pulls"] == 1 and doc["bytes"] == 8_000_000
    line = format_summary(dict(doc, rank=3, host="h3"))
    assert line.startswith("bpslaunch: worker rank 3 (host h3): 1 push_pull(s), 8.0 MB")


def test_lanes_never_overlap():
    iv = sorted([(0, 5), (1, 3), (3, 4), (5, 6), (2, 7)])
    lanes = _lanes(iv)
    for i, a in enumerate(iv):
        for j, b in enumerate(iv):
            if i < j and lanes[i] == lanes[j]:
                assert a[1] <= b[0] or b[1] <= a[0], (a, b)
    assert max(lanes) + 1 == 3                # the deepest overlap is 3


def test_steps_window_and_trace_file(tmp_path):
    tl = Timeline(str(tmp_path), rank=1, size=4, start_step=1, end_step=2)
    hid = 0
    tl.steps.pushed("broadcast.w")              # a broadcast before training: step 0
    tl.begin(99, "broadcast.w", 0.0)
    for step in range(4):
        for name in ("first", "second"):
            hid += 1
            t0 = 10.0 * step + (0 if name == "first" else 1)
            tl.steps.pushed(name)
            tl.begin(hid, name, t0)
            if not tl.traced(hid):
                continue
            t = _task(hid, 0, 4_000_000, sent_at=t0 + 0.5)
            tl.part_done(t, t0 + 2.0, t0 + 2.1)
            tl.handle_done(t.handle, t0 + 2.1)
        assert tl.written == (step >= 3)
        tl.steps.mark()                          # the optimizer's step() ends the step
        assert tl.written == (step >= 2)         # written when step end+1 began
    assert tl.step == 4
    doc = json.loads((tmp_path / "1" / "comm.json").read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    tensors = [e for e in xs if e["cat"] == "tensor"]
    assert sorted((e["name"], e["args"]["step"]) for e in tensors) == [
        ("first", 1), ("first", 2), ("second", 1), ("second", 2)]
    assert {e["name"] for e in xs if e["cat"] == "partition"} == STAGES
    q = next(e for e in xs if e["name"] == "queue" and e["args"]["tensor"] == "first")
    assert q["dur"] == pytest.approx(0.5e6)
    assert all(e["pid"] == 1 and e["dur"] >= 0 for e in xs)
    est = [e for e in xs if e["name"] == "server_sum (est.)"]
    assert all(e["args"]["estimated"] is True for e in est)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "partitions 0" in names and "tensors 0" in names


def test_step_counter_rules():
    """Explicit marks (optimizers) win over implicit ones (numpy synchronize); without any
    mark a step starts when a name is pushed again: a broadcast first never starts one."""
    sc = StepCounter()
    seen = []
    sc.listeners.append(seen.append)
    for name in ("broadcast.w", "g1", "g2", "g1", "g2", "g1"):
        sc.pushed(name)
    assert sc.n == 2 and seen == [1, 2]
    assert sc.mark(implicit=True) and sc.n == 3
    sc.pushed("g1")
    sc.pushed("g1")                           # marked once: names no longer count
    assert sc.n == 3
    assert sc.mark() and sc.n == 4
    assert not sc.mark(implicit=True) and sc.n == 4     # explicit from now on
    assert sc.mark() and sc.n == 5 and seen[-1] == 5


@pytest.mark.timeout(150)
def test_trace_files_from_a_real_job(tmp_path):
    traces, out = tmp_path / "traces", tmp_path / "out"
    out.mkdir()
    res = run_script("trace_pushpull.py", out, workers=2, servers=2, timeout=120,
                     BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=traces, BYTEPS_TRACE_START_STEP=1,
                     BYTEPS_TRACE_END_STEP=3, BYTEPS_PARTITION_BYTES=400_000)
    assert_ok(res)
    for rank in (0, 1):
        doc = json.loads((traces / str(rank) / "comm.json").read_text())
        xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        tensors = [e for e in xs if e["cat"] == "tensor"]
        # steps 1..3 of both tensors, nothing else
        assert sorted((e["name"], e["args"]["step"]) for e in tensors) == sorted(
            (n, s) for n in ("layer.bias", "layer.weight") for s in (1, 2, 3))
        parts = [e for e in xs if e["cat"] == "partition"]
        assert {e["name"] for e in parts} == STAGES
        # 1.2 MB weight in 400 KB partitions: 3 partitions + 1 bias partition, per step
        assert sum(e["name"] == "queue" for e in parts) == 3 * 4
        for e in xs:
            assert e["ts"] > 1.6e15 and e["dur"] >= 0
    speeds = read_results(out)
    assert all(v["speed"] > 0 for v in speeds.values()), speeds
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("bpslaunch: worker rank")]
    assert len(lines) == 2, res.stderr
    assert "5 push_pull" not in lines[0] and "10 push_pull(s)" in lines[0]


def test_other_stages_get_their_own_lanes(tmp_path):
    tl = Timeline(str(tmp_path), rank=0, size=2, start_step=0, end_step=9)
    tl.span("local reduce-scatter", 1.0, 3.0, cat="local", tensor="a")
    tl.span("local reduce-scatter", 2.0, 4.0, cat="local", tensor="b")
    tl.span("network + all-gather", 3.0, 5.0, cat="local", tensor="a")
    xs = [e for e in tl.events() if e["ph"] == "X"]
    by = {(e["args"]["tensor"], e["name"]): e["tid"] for e in xs}
    assert by[("a", "local reduce-scatter")] != by[("b", "local reduce-scatter")]
    assert all(e["cat"] == "local" and e["tid"] >= 2000 for e in xs)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flavour,grads", [("numpy", {"grad.w", "grad.b"}),
                                           ("torch", {"Gradient.weight", "Gradient.bias"})])
def test_trace_window_counts_training_steps_after_a_broadcast(tmp_path, flavour, grads):
    """Steps come from the optimizer's step() / numpy synchronize, not from the first
    tensor pushed (a broadcast, pushed once): steps 3..5 hold exactly 3 steps' gradients."""
    traces = tmp_path / "traces"
    res = run_script("trace_broadcast_first.py", flavour, 8, workers=2, servers=1, timeout=180,
                     BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=traces, BYTEPS_TRACE_START_STEP=3,
                     BYTEPS_TRACE_END_STEP=5)
    assert_ok(res)
    for rank in (0, 1):
        doc = json.loads((traces / str(rank) / "comm.json").read_text())
        tensors = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "tensor"]
        assert sorted((e["name"], e["args"]["step"]) for e in tensors) == sorted(
            (n, s) for n in grads for s in (3, 4, 5)), tensors


def test_autotunes_own_exchanges_are_never_traced(tmp_path):
    """Autotune's exchanges (the init probe's ``byteps.autotune.probe.sums``, the plans)
    are kept out of the trace when they start, not removed after: removing them raced
    with their completion, and a fast one landed in a user's step (seen in CI)."""
    from byteps.core.timeline import Timeline
    tl = Timeline(str(tmp_path), 0, 1, 0, 5, sample=1)
    tl.untraced += ("byteps.autotune.",)
    tl.begin(1, "byteps.autotune.probe.sums", 0.0)
    tl.begin(2, "layer.weight", 0.0)
    assert not tl.traced(1) and tl.traced(2)

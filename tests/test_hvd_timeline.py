"""Horovod's timeline: HOROVOD_TIMELINE=PATH and start_timeline(PATH) write one Chrome trace
on rank 0, valid JSON while the job runs, with Horovod's rows and phases
(byteps/core/hvd_timeline.py; Horovod's own test_timeline.py runs in
tests/test_horovod_suites.py)."""
from __future__ import annotations

import json
import time
import types

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

from byteps.core import hvd_timeline

pytestmark = pytest.mark.timeout(180)


def _rows(doc: list) -> dict[str, list]:
    """The X events of each tensor row, by the row's name (pid's process_name)."""
    names = {e["pid"]: e["args"]["name"] for e in doc
             if e["ph"] == "M" and e["name"] == "process_name" and "name" in e["args"]}
    rows: dict[str, list] = {}
    for e in doc:
        if e["ph"] == "X" and e["pid"] in names:
            rows.setdefault(names[e["pid"]], []).append(e)
    return rows


def _check(doc: list, cycles: bool, flat: bool = True) -> dict[str, list]:
    assert doc[0]["pid"] == 0 and doc[0]["args"]["start_time_since_epoch_in_micros"] > 1.6e15
    rows = _rows(doc)
    assert {"allreduce.small", "allreduce.big", "allgather.gath", "broadcast.bc"} <= set(rows)
    assert not [n for n in rows if n.startswith(("allreduce.byteps.", "allreduce.gath"))]
    for name, evs in rows.items():
        phases = [e for e in evs if e["tid"] == 0]
        kind = name.split(".")[0].upper()
        assert any(e["name"] == f"NEGOTIATE_{kind}" for e in phases), (name, evs)
        assert any(e["name"] == kind for e in phases), (name, evs)
        assert any(e["name"] == "0" and e["dur"] == 0 for e in evs), (name, evs)   # rank 0
        for e in evs:
            assert e["ts"] >= 0 and e["dur"] >= 0
        neg = min(e["ts"] for e in phases if e["name"] == f"NEGOTIATE_{kind}")
        assert neg <= min(e["ts"] for e in phases if e["name"] == kind), (name, evs)
    op = next(e for e in rows["allreduce.big"] if e["name"] == "ALLREDUCE")
    assert op["args"]["dtype"] == "float32" and op["args"]["bytes"] == 4_000_000, op
    assert op["args"]["shape"] == "(1000000,)"
    parts = [e for e in rows["allreduce.big"] if e["tid"] >= 1]
    if not flat:                # local reduction: the host's stages are not rank 0's own
        assert not parts, parts
        return rows
    assert {e["name"] for e in parts} == {"push", "server+pull"}
    assert len({e["args"]["part"] for e in parts}) == 4       # 4 MB in 1 MB partitions
    assert sum(e["args"]["bytes"] for e in parts if e["name"] == "push") == 4_000_000
    assert any(e["ph"] == "i" and e["name"] == "CYCLE_START" for e in doc) == cycles
    return rows


def test_rows_phases_and_a_file_valid_after_every_write(tmp_path):
    path = tmp_path / "t.json"
    tl = hvd_timeline.HorovodTimeline(str(path), rank=0, mark_cycles=True)
    assert json.loads(path.read_text())[0]["args"]["start_time_since_epoch_in_micros"] > 0
    assert tl.begin("byteps.autotune.plan", time.monotonic()) is None     # byteps's own
    with hvd_timeline.collective("broadcast", "broadcast.w"):          # the core's broadcast
        with hvd_timeline.collective("broadcast", "broadcast.w.1", inner=True):
            assert tl.begin("broadcast.w", time.monotonic()).label == "broadcast.w"
    done = types.SimpleNamespace(out=np.zeros((2, 3), np.float16), error=None)
    plain = tl.begin("w", time.monotonic())
    with hvd_timeline.collective("allgather", "g"):
        meta = tl.begin("g.meta.2x34", time.monotonic())
        data = tl.begin("g.data", time.monotonic())
    assert [(r.label, r.kind, r.phase) for r in (plain, meta, data)] == [
        ("allreduce.w", "ALLREDUCE", "op"), ("allgather.g", "ALLGATHER", "negotiate"),
        ("allgather.g", "ALLGATHER", "data")]
    t = time.monotonic()
    for part in (0, 1):
        plain.part(types.SimpleNamespace(part=part, server=part, nbytes=6, sent_at=t), t + 1e-3)
    plain.acks[0] = t + 5e-4
    for rec in (plain, plain, meta, data):         # a record is written once
        rec.finish(done)
    tl.cycle()
    tl.stop()
    doc = json.loads(path.read_text())
    rows = _rows(doc)
    assert set(rows) == {"allreduce.w", "allgather.g"}
    assert [e["name"] for e in rows["allreduce.w"] if e["tid"] == 0] == \
        ["NEGOTIATE_ALLREDUCE", "0", "ALLREDUCE"]
    op = next(e for e in rows["allreduce.w"] if e["name"] == "ALLREDUCE")
    assert op["args"] == {"dtype": "float16", "shape": "(2, 3)", "bytes": 12}
    assert sorted(e["name"] for e in rows["allreduce.w"] if e["tid"] >= 1) == \
        ["push", "push", "server+pull", "server+pull"]
    assert [e["name"] for e in rows["allgather.g"]] == ["NEGOTIATE_ALLGATHER", "0", "ALLGATHER"]
    assert sum(e["name"] == "CYCLE_START" for e in doc) == 1
    with pytest.raises(ValueError, match=r"timeline file '/nonexistent/t.json' cannot be "
                                         r"written on rank 0: .*give a path in a writable"):
        hvd_timeline.HorovodTimeline("/nonexistent/t.json", rank=0)
    # the file stays a JSON array while it grows (Horovod's trailing "]")
    tl2 = hvd_timeline.HorovodTimeline(str(tmp_path / "u.json"), rank=0)
    for i in range(3):
        tl2._write([{"ph": "i", "name": str(i), "ts": i, "s": "g"}])
        assert len(json.loads((tmp_path / "u.json").read_text())) == 3 + i
    tl2.stop()


@pytest.mark.parametrize("mode", ["env", "api", "local"])
def test_horovods_timeline_file_on_rank_0(tmp_path, mode):
    out, path = tmp_path / "out", tmp_path / "timeline.json"
    out.mkdir()
    env = {"HOROVOD_TIMELINE": path, "HOROVOD_TIMELINE_MARK_CYCLES": 1} if mode != "api" \
        else {}
    n = 4 if mode == "local" else 2           # local: 2 hosts of 2 ranks (local reduction)
    layout = ("--hosts", "2", "--local-size", "2") if mode == "local" else ()
    res = run_script("hvd_timeline.py", out, path, "env" if mode == "local" else mode,
                     workers=n, servers=2, timeout=150, launcher_args=layout,
                     BYTEPS_PARTITION_BYTES=1 << 20, **env)
    assert_ok(res)
    got = read_results(out)
    assert {got[r]["big"] for r in range(n)} == {n * (n + 1) / 2}
    assert got[0]["gathered"] == n * (n + 1) / 2
    assert got[0]["bc"] == got[n - 1]["bc"] == [0.0, 2.0, 4.0, 6.0]
    _check(got[0]["live"], cycles=True, flat=mode != "local")   # read while the job ran
    final = json.loads(path.read_text())                # closed at shutdown/stop_timeline
    assert len(final) >= len(got[0]["live"])
    _check(final, cycles=True, flat=mode != "local")
    assert all(got[r]["live"] is None for r in range(1, n))
    headers = [e for e in final if e.get("pid") == 0 and e["name"] == "process_name"]
    assert len(headers) == 1, headers         # one file, one time base
    assert ("allreduce.again" in _rows(final)) == (mode != "api"), set(_rows(final))
    if mode == "api":                 # stop_timeline, then another file: only what followed
        second = _rows(got[0]["second"])
        assert set(second) == {"allreduce.after"}, set(second)
        assert not any(e["ph"] == "i" for e in got[0]["second"])     # mark_cycles=False
        assert "allreduce.after" not in _rows(final)

"""benchmarks/cluster/pipeline.py: fill, steady rate and drain from a real Timeline trace."""
import types

import pytest

from benchmarks.cluster import pipeline
from byteps.core.timeline import Timeline


def _trace(tmp_path, rank: int):
    """One 10-partition push_pull (100 bytes each): starts at 1.0 s; partition i is sent at
    1.0 + 0.01 i, acknowledged 0.05 s later and its result is in at 1.1 + 0.01 i, except
    the last, whose result comes 0.1 s after its acknowledgement (the drain)."""
    tl = Timeline(str(tmp_path), rank=rank, size=2, start_step=0, end_step=5, sample=1)
    tl.begin(1, "g", 1.0)
    h = types.SimpleNamespace(id=1, error=None, out=types.SimpleNamespace(nbytes=1000))
    for i in range(10):
        t = types.SimpleNamespace(handle=h, part=i, nbytes=100, server=i % 2,
                                  sent_at=1.0 + 0.01 * i)
        tl.acked(t, t.sent_at + 0.05)
        done = t.sent_at + 0.15 if i == 9 else 1.1 + 0.01 * i
        tl.part_done(t, done, done)
    tl.handle_done(h, 1.24)
    tl.write()


def test_phases_of_a_traced_operation(tmp_path):
    for r in (0, 1):
        _trace(tmp_path, r)
    s = pipeline.summary(tmp_path, mesh_gbps=8e-6)       # 1000 bytes/s
    assert s["ops"] == 2
    assert s["op_ms"] == pytest.approx(240.0, rel=1e-3)
    assert s["fill_ms"] == pytest.approx(100.0, rel=1e-3)      # the first result at 1.1
    assert s["first10_ms"] == pytest.approx(100.0, rel=1e-3)   # one partition: 10 %
    assert s["last10_ms"] == pytest.approx(60.0, rel=1e-3)     # 90 % at 1.18, last 1.24
    assert s["drain_ms"] == pytest.approx(100.0, rel=1e-3)     # acked 1.14, result 1.24
    # 10 % -> 90 %: 800 bytes in 80 ms
    assert s["steady_MBps"] == pytest.approx(0.01, rel=1e-3)
    assert s["mesh_bound_ms"] == pytest.approx(1000.0, rel=1e-3)
    assert s["op_vs_mesh"] == pytest.approx(1000 / 240, rel=1e-3)
    text = pipeline.table({"byteps": s, "empty": {}})
    assert "byteps" in text and "empty" not in text and "steady/mesh" in text


def test_no_traces(tmp_path):
    assert pipeline.summary(tmp_path) == {}
    assert pipeline.table({"x": {}}) == ""


def test_tcp_cc_outside_the_allowed_list_is_refused_with_the_fix():
    from pathlib import Path

    from benchmarks.cluster.netns import tcp_cc_name
    f = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    if not f.exists():
        pytest.skip("no Linux TCP sysctls here")
    allowed = f.read_text().split()
    assert tcp_cc_name(allowed[0]) == allowed[0]
    name = next(c for c in ("vegas", "westwood", "htcp", "zzz") if c not in allowed)
    with pytest.raises(ValueError, match="tcp_allowed_congestion_control"):
        tcp_cc_name(name)

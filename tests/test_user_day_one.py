"""What a new user checks first, end to end: one 2-worker numpy job (compression on a
small model says which tensors it left uncompressed, once, and the summary shows the
bytes on the wire; broadcast_object of a Namespace and a dataclass), and a one-worker
job (bpslaunch -np 1) that runs every common call with no scheduler or server."""
from __future__ import annotations

import re
import sys

import pytest

from conftest import SCRIPTS, BPSLAUNCH, assert_ok, job_env, read_results, run_job

pytestmark = pytest.mark.timeout(180)
SCRIPT = str(SCRIPTS / "day_one_numpy.py")


def test_compressed_small_model_job_says_what_it_skipped_and_shows_wire_bytes(tmp_path):
    res = run_job([sys.executable, SCRIPT, str(tmp_path)], workers=2, servers=1,
                  timeout=150, launcher_args=("--hosts", "2"))   # traffic crosses hosts
    assert_ok(res)
    out = res.stdout + res.stderr
    notices = [ln for ln in out.splitlines() if "travel uncompressed" in ln]
    assert len(notices) == 1, out                 # once per job, by rank 0
    text = notices[0]
    assert "3 tensor(s)" in text and "'w.small' (400 B)" in text and "'w.bias' (40 B)" in text
    assert "BYTEPS_MIN_COMPRESS_BYTES=65536" in text and "'steps' (int64)" in text
    assert "w.big" not in text
    lines = [ln for ln in out.splitlines() if ln.startswith("bpslaunch: worker rank")]
    assert len(lines) == 2, out
    for ln in lines:
        m = re.search(r"compressed: ([\d.]+) MB on the wire for ([\d.]+) MB pushed, "
                      r"([\d.]+) MB for ([\d.]+) MB pulled", ln)
        assert m, ln
        wire_out, raw_out, wire_in, raw_in = map(float, m.groups())
        assert 0 < wire_out < raw_out / 3 and 0 < wire_in < raw_in / 3, ln   # int8: ~1/4
    got = read_results(tmp_path)
    assert [got[r]["args"] for r in (0, 1)] == [{"lr": 0.1, "epochs": 3, "data": "/d0"}] * 2


def test_one_worker_job_runs_without_scheduler_or_server(tmp_path):
    """bpslaunch -np 1: the script's common calls (push_pull, compression settings,
    broadcast(_object), collectives, join) in-process; no scheduler or server starts."""
    import subprocess
    cmd = BPSLAUNCH + ["-np", "1", sys.executable, SCRIPT, str(tmp_path)]
    res = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=120)
    assert_ok(res)
    got = read_results(tmp_path)
    assert got[0]["size"] == 1 and got[0]["last_joined"] == 0
    assert got[0]["communicates"] is False       # no engine: no sockets, no server
    out = res.stdout + res.stderr
    assert "server" not in out.lower() and "scheduler" not in out.lower(), out


def test_skip_notice_text_for_one_host_and_for_small_tensors():
    """The notice's two forms (SkipNotice, the engine's compression stage): on one host with
    local reduction nothing crosses the network; elsewhere the small and integer tensors."""
    import numpy as np
    from byteps.core.engine.compression import SkipNotice
    one = SkipNotice(65536, one_host=True)
    one.note("w", np.zeros(1 << 16, np.float32), True)
    assert "nothing is compressed" in one.line() and "BYTEPS_LOCAL_REDUCE=0" in one.line()
    many = SkipNotice(1024)
    for i in range(15):
        many.note(f"b{i}", np.zeros(4, np.float32), False)
    many.note("big", np.zeros(4096, np.float32), True)
    text = many.line()
    assert "15 tensor(s)" in text and "and 3 more" in text and "'big'" not in text
    assert "BYTEPS_MIN_COMPRESS_BYTES=1024" in text
    assert SkipNotice(1).line() is None


def test_summary_and_live_line_show_wire_bytes_next_to_raw():
    from byteps.common.summary import format_summary
    from byteps.launcher import liveview
    doc = {"rank": 0, "host": "h", "push_pulls": 4, "bytes": 8_000_000, "active_s": 1.0,
           "avg_MBps": 8.0, "pushed": 4_000_000, "pushed_wire": 1_000_000,
           "pulled": 4_000_000, "pulled_wire": 1_000_000}
    assert format_summary(doc).endswith("; compressed: 1.00 MB on the wire for 4.00 MB "
                                        "pushed, 1.00 MB for 4.00 MB pulled (4.0x less)")
    plain = dict(doc, pushed_wire=4_000_000, pulled_wire=4_000_000)
    assert "compressed" not in format_summary(plain)
    live = liveview.line(dict(doc, t=0.0, step=3, MBps=1.0), 0, 0.0, 5.0)
    assert "(compressed: 1.0 MB on the wire for 4.0 MB pushed)" in live

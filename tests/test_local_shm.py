"""Shared-memory segments of the local reduction (no sockets, no processes)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from byteps.common.shm_cleanup import remove_prefix
from byteps.core.local.shm import Segment, host_prefix, job_prefix


def _seg(tmp_path, name="w", n=10, dtype=np.float32, L=2, chunk=4, groups=1, rank=0):
    return Segment(str(tmp_path / (host_prefix("job-1", "host0") + "e1-t1")), name,
                   np.dtype(dtype), 0, n, L, chunk, groups, rank)


def test_create_then_open_shares_memory(tmp_path):
    a = _seg(tmp_path, rank=0)
    b = _seg(tmp_path, rank=1)
    assert a.created and not b.created
    assert a.C == 3 and a.inputs.shape == (2, 10) and a.out.shape == (10,)
    a.inputs[1, :] = 7
    a.done[1, 2] = 5
    assert np.all(b.inputs[1] == 7) and b.done[1, 2] == 5
    assert [a.split(2, 2, i) for i in (0, 1)] == [(8, 9), (9, 10)]
    assert [a.split(0, 3, i) for i in range(3)] == [(0, 1), (1, 2), (2, 4)]
    for s in (a, b):
        s.close()


def test_mismatched_shape_is_a_clear_error(tmp_path):
    a = _seg(tmp_path, n=10)
    with pytest.raises(ValueError, match=r"tensor 'w': local rank 1 uses 12 x float32.*same "
                                         r"shape and dtype"):
        _seg(tmp_path, n=12, rank=1)
    a.close()


def test_two_level_layout_and_no_temp_files_left(tmp_path):
    a = _seg(tmp_path, n=100, L=4, chunk=30, groups=2)
    assert a.gsum.shape == (2, 100) and a.C == 4
    assert [p.name for p in tmp_path.iterdir()] == [host_prefix("job-1", "host0") + "e1-t1"]
    a.close()


def test_remove_prefix_only_touches_the_job(tmp_path):
    mine = _seg(tmp_path)
    other = tmp_path / (job_prefix("job-10") + "host0-x")
    other.write_text("x")
    gone = remove_prefix(str(tmp_path), job_prefix("job-1"))
    assert gone == [host_prefix("job-1", "host0") + "e1-t1"]
    assert other.exists()
    with pytest.raises(ValueError, match="not a BytePS prefix"):
        remove_prefix(str(tmp_path), "")
    mine.close()


def test_prefix_names_are_safe():
    assert job_prefix("standalone-1a2b") == "bps-standalone-1a2b-"
    p = host_prefix("j", "10.0.0.1/" + "h" * 80)
    assert "/" not in p and len(p) < 60


def test_local_reduce_setting():
    from byteps.core.config import Config, ConfigError
    env = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9000"}
    assert Config.from_env(env).local_reduce == "root"
    for raw, mode in (("0", "off"), ("1", "root"), ("slice", "slice"), ("ROOT", "root")):
        assert Config.from_env(dict(env, BYTEPS_LOCAL_REDUCE=raw)).local_reduce == mode
    with pytest.raises(ConfigError, match="BYTEPS_LOCAL_REDUCE='3' is invalid"):
        Config.from_env(dict(env, BYTEPS_LOCAL_REDUCE="3"))
    assert Config.from_env(dict(env, BYTEPS_PCIE_SWITCH_SIZE="2")).pcie_switch_size == 2


def test_peer_liveness_sees_zombies_and_reaped_processes():
    import os
    import subprocess
    import sys
    import time

    from byteps.core.local.parts import alive
    assert alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while alive(p.pid) and time.monotonic() < deadline:     # exits, stays a zombie
        time.sleep(0.05)
    assert not alive(p.pid)
    p.wait()
    assert not alive(p.pid)
    assert alive(None) and alive(-1)        # unknown pid: never reported dead


def test_segment_window_layout_on_a_small_tmpfs(small_tmpfs):
    """A segment that does not fit falls back to a window (reserved with posix_fallocate);
    the other local rank adopts the creator's chunk size; nothing fits: a clear error."""
    from byteps.core.local.shm import ShmSpaceError
    d = small_tmpfs(4)
    path = str(d / (host_prefix("job-1", "host0") + "e1-t1"))
    n = 1 << 20                                        # 4 MiB of float32: 12 MiB in full
    a = Segment(path, "w", np.dtype(np.float32), 0, n, 2, n // 4, 1, 0, fixed_chunk=False)
    b = Segment(path, "w", np.dtype(np.float32), 0, n, 2, n // 4, 1, 1, fixed_chunk=False)
    assert a.created and a.windowed and a.fallback and "--shm-size" in a.fallback
    assert (b.chunk, b.W, b.C) == (a.chunk, a.W, a.C) and a.chunk < n // 4 and b.fallback is None
    assert a.size <= 4 << 20 and a.inputs.shape == (2, a.W * a.chunk)
    j = a.W + 1                                         # chunk j reuses slot j % W
    assert a.off(j) == -a.W * a.chunk and a.off(1) == 0
    assert not a.slot_free(j, 1)
    a.gathered[:, j - a.W] = 1
    assert a.slot_free(j, 1)
    with pytest.raises(ShmSpaceError, match=r"tensor 'x'.*--shm-size.*BYTEPS_LOCAL_REDUCE=0"):
        Segment(str(d / "bps-x"), "x", np.dtype(np.float32), 0, 8 << 20, 2, 1 << 20, 1, 0)
    assert sorted(os.listdir(d)) == [os.path.basename(path)]     # no temp file left
    for s in (a, b):
        s.close()


def test_a_temporary_file_removed_before_publishing_is_made_again(tmp_path, monkeypatch):
    """Something that cleans /dev/shm (another test session, a tmp reaper) may remove the
    creator's ``.tmpPID`` file between its creation and its publication: the segment is
    made again instead of failing the first push_pull of the tensor."""
    import byteps.core.local.shm as shm_mod
    real_link, removed = os.link, []

    def link_after_a_cleaner(src, dst):
        if not removed:                  # the cleaner strikes once, at the worst moment
            os.unlink(src)
            removed.append(src)
        return real_link(src, dst)
    monkeypatch.setattr(shm_mod.os, "link", link_after_a_cleaner)
    seg = _seg(tmp_path)
    assert removed and seg.created and os.path.exists(seg.path)
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    seg.close()


def test_segments_keep_no_file_descriptor(tmp_path):
    """A mapped segment holds no descriptor (Python's mmap keeps one per map: a server with
    a few thousand names ran out of them, EMFILE, and its pushes were lost)."""
    from byteps.transport import shm
    before = len(os.listdir("/proc/self/fd"))
    segs = [shm.Segment(str(tmp_path / f"seg{i}"), 4096, True) for i in range(200)]
    views = [s.array(np.float32, 1024) for s in segs]
    views[0][:] = 7
    assert len(os.listdir("/proc/self/fd")) == before
    assert shm.Segment(str(tmp_path / "seg0"), 4096, False).array(np.float32, 4)[0] == 7
    segs[0].close()                  # a view is alive: stays mapped, the file is removed
    assert views[0][1] == 7 and not (tmp_path / "seg0").exists()
    del views
    for s in segs[1:]:
        s.close()
    assert not list(tmp_path.iterdir())

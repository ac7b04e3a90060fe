"""HOROVOD_* variables in the one config: those with an equivalent set it (an explicit
BYTEPS_* wins), a malformed one is an error naming it, the others are named with their
equivalent once at init on rank 0 (byteps/common/horovod_env.py)."""
from __future__ import annotations

import logging
import os

import pytest

from byteps.common import horovod_env
from byteps.common.config import Config, ConfigError

pytestmark = pytest.mark.timeout(60)


def test_honoured_variables_set_the_config():
    cfg = Config.from_env({"HOROVOD_TIMELINE": "/tmp/tl.json", "HOROVOD_FUSION_THRESHOLD": "0",
                           "HOROVOD_CYCLE_TIME": "5", "HOROVOD_LOG_LEVEL": "debug",
                           "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
                           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120",
                           "HOROVOD_AUTOTUNE": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
                           "HOROVOD_START_TIMEOUT": "15"})
    assert (cfg.trace_on, cfg.trace_dir, cfg.fusion_bytes) == (True, "/tmp/tl", 0)
    assert cfg.log_level == logging.DEBUG and cfg.stall_warning_s == 30.0
    assert cfg.stall_shutdown_s == 120.0 and cfg.autotune is False
    assert cfg.local_reduce == "off" and cfg.startup_timeout == 15.0
    # Horovod's "off" values set nothing: the defaults stay
    cfg = Config.from_env({"HOROVOD_TIMELINE": "DYNAMIC",
                           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"})
    assert cfg.trace_on is False and cfg.stall_shutdown_s is None


def test_explicit_byteps_variable_wins():
    env = {"HOROVOD_FUSION_THRESHOLD": "0", "BYTEPS_FUSION_BYTES": "1024",
           "HOROVOD_TIMELINE": "/tmp/a.json", "BYTEPS_TRACE_DIR": "/tmp/mine",
           "HOROVOD_LOG_LEVEL": "debug", "BYTEPS_LOG_LEVEL": "ERROR"}
    cfg = Config.from_env(env)
    assert cfg.fusion_bytes == 1024 and cfg.log_level == logging.ERROR
    assert cfg.trace_on and cfg.trace_dir == "/tmp/mine"
    lines = horovod_env.notes(env)
    assert "HOROVOD_FUSION_THRESHOLD=0 is ignored: BYTEPS_FUSION_BYTES=1024 is set and wins" \
        in lines
    assert any(x.startswith("HOROVOD_TIMELINE=/tmp/a.json -> BYTEPS_TRACE_ON=1, "
                            "BYTEPS_TRACE_DIR=/tmp/mine") for x in lines)


def test_malformed_value_names_the_horovod_variable():
    with pytest.raises(ConfigError, match=r"HOROVOD_FUSION_THRESHOLD='lots' \(read as "
                                          r"BYTEPS_FUSION_BYTES=lots\) is invalid"):
        Config.from_env({"HOROVOD_FUSION_THRESHOLD": "lots"})
    with pytest.raises(ConfigError, match="HOROVOD_STALL_CHECK_TIME_SECONDS='-1'"):
        Config.from_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "-1"})


def test_the_rest_are_named_with_their_equivalent():
    env = {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_CACHE_CAPACITY": "0",
           "HOROVOD_THREAD_AFFINITY": "0,1", "HOROVOD_FROBNICATE": "1", "HOROVOD_RANK": "0"}
    lines = horovod_env.notes(env)
    assert len(lines) == 4, lines          # HOROVOD_RANK: set by init(), not an input
    text = "\n".join(lines)
    assert "HOROVOD_CYCLE_TIME=5 has no equivalent: there is no background cycle" in text
    assert "HOROVOD_CACHE_CAPACITY=0 has no equivalent: there is no response cache" in text
    assert "HOROVOD_THREAD_AFFINITY=0,1 has no effect here; use BYTEPS_NUMA_ON" in text
    assert "HOROVOD_FROBNICATE=1 has no effect: byteps does not know it" in text


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_rank0_logs_the_notes_once_at_init(monkeypatch):
    import byteps.numpy as bps
    from byteps.core import api
    for k in list(os.environ):
        if k.startswith(("DMLC_", "BYTEPS_", "HOROVOD_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3.5")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    monkeypatch.setattr(horovod_env, "_LOGGED", [])
    rec = _Records()                 # (the byteps logger does not propagate to pytest's)
    logging.getLogger("byteps").addHandler(rec)
    try:
        for _ in range(2):               # a second init() does not repeat it
            bps.init()
            assert api.get_config().fusion_bytes == 1048576
            bps.shutdown()
    finally:
        logging.getLogger("byteps").removeHandler(rec)
    err = "\n".join(rec.lines)
    assert err.count("HOROVOD_* variables") == 1, err
    assert "HOROVOD_CYCLE_TIME=3.5 has no equivalent" in err
    assert "HOROVOD_FUSION_THRESHOLD=1048576 -> BYTEPS_FUSION_BYTES=1048576" in err


def test_docs_table_names_every_mapped_variable():
    from conftest import ROOT
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text[text.index("| Horovod variable | here |"):]
    missing = [n for n in [*horovod_env.HONOURED, *horovod_env.NAMED] if f"`{n}" not in table]
    assert not missing, f"docs/configuration.md's HOROVOD_* table lacks {missing}"

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
    assert (cfg.timeline, cfg.trace_on, cfg.fusion_bytes) == ("/tmp/tl.json", False, 0)
    assert cfg.log_level == logging.DEBUG and cfg.stall_warning_s == 30.0
    assert cfg.stall_shutdown_s == 120.0 and cfg.autotune is False
    assert cfg.local_reduce == "off" and cfg.startup_timeout == 15.0
    # Horovod's "off" values set nothing: the defaults stay
    cfg = Config.from_env({"HOROVOD_TIMELINE": "DYNAMIC",
                           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"})
    assert cfg.timeline is None and cfg.stall_shutdown_s is None
    cfg = Config.from_env({"HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert cfg.timeline_mark_cycles is True


def test_explicit_byteps_variable_wins():
    env = {"HOROVOD_FUSION_THRESHOLD": "0", "BYTEPS_FUSION_BYTES": "1024",
           "HOROVOD_TIMELINE": "/tmp/a.json", "BYTEPS_TIMELINE": "/tmp/mine.json",
           "HOROVOD_LOG_LEVEL": "debug", "BYTEPS_LOG_LEVEL": "ERROR"}
    cfg = Config.from_env(env)
    assert cfg.fusion_bytes == 1024 and cfg.log_level == logging.ERROR
    assert cfg.timeline == "/tmp/mine.json"
    lines = horovod_env.notes(env)
    assert "HOROVOD_FUSION_THRESHOLD=0 is ignored: BYTEPS_FUSION_BYTES=1024 is set and wins" \
        in lines
    assert "HOROVOD_TIMELINE=/tmp/a.json is ignored: BYTEPS_TIMELINE=/tmp/mine.json is set " \
        "and wins" in lines


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


def test_runner_env_rank_and_size_reads_the_launchers_variables(monkeypatch):
    """``byteps.runner.common.util.env.get_env_rank_and_size`` (Horovod's module path, which
    its process-set suites import): horovodrun's (and bpslaunch's) HOROVOD_RANK/SIZE first,
    then Open MPI's and PMI's; (0, 1) with none; half a pair or a bad value is an error
    naming the variables."""
    from byteps.runner.common.util.env import get_env_rank_and_size
    for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert get_env_rank_and_size() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "4")
    assert get_env_rank_and_size() == (1, 4)
    monkeypatch.setenv("HOROVOD_RANK", "2")
    monkeypatch.setenv("HOROVOD_SIZE", "3")
    assert get_env_rank_and_size() == (2, 3)          # horovodrun's names win
    monkeypatch.delenv("HOROVOD_SIZE")
    with pytest.raises(RuntimeError, match="HOROVOD_RANK and HOROVOD_SIZE"):
        get_env_rank_and_size()
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with pytest.raises(RuntimeError, match="HOROVOD_RANK=2 is not a rank"):
        get_env_rank_and_size()
    monkeypatch.setenv("HOROVOD_SIZE", "two")
    with pytest.raises(RuntimeError, match="whole numbers"):
        get_env_rank_and_size()
    import byteps.runner
    from byteps.launcher.pyrun import run
    assert byteps.runner.run is run                  # horovod.runner.run


def test_common_util_env_sets_and_restores(monkeypatch):
    """``byteps.common.util.env`` (Horovod's ``horovod.common.util.env``): the variables
    hold inside the block and are restored (or removed) after it, even on an error."""
    from byteps.common.util import env
    monkeypatch.setenv("BPS_TEST_KEEP", "old")
    monkeypatch.delenv("BPS_TEST_NEW", raising=False)
    with pytest.raises(KeyError):
        with env(BPS_TEST_KEEP="new", BPS_TEST_NEW=1, BPS_TEST_SKIP=None):
            assert (os.environ["BPS_TEST_KEEP"], os.environ["BPS_TEST_NEW"]) == ("new", "1")
            assert "BPS_TEST_SKIP" not in os.environ
            raise KeyError("inside")
    assert os.environ["BPS_TEST_KEEP"] == "old" and "BPS_TEST_NEW" not in os.environ


def test_every_variable_horovod_reads_is_named():
    """Every HOROVOD_* variable of Horovod's horovod/common/common.h (as of the vendored
    suites' commit), and those its runner sets (log level, gloo timeout), is honoured or
    named with its equivalent."""
    horovods = {
        "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_CACHE_CAPACITY", "HOROVOD_CCL_CACHE",
        "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CYCLE_TIME",
        "HOROVOD_DISABLE_GROUP_FUSION", "HOROVOD_DISABLE_NVTX_RANGES",
        "HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ELASTIC", "HOROVOD_ENABLE_ASYNC_COMPLETION",
        "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_GLOO_IFACE",
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_HIERARCHICAL_ALLREDUCE",
        "HOROVOD_LOG_LEVEL", "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_NUM_NCCL_STREAMS",
        "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_THREAD_AFFINITY", "HOROVOD_TIMELINE",
        "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_TORUS_ALLREDUCE"}
    lines = horovod_env.notes({v: "1" for v in horovods})
    assert not [x for x in lines if "byteps does not know it" in x], lines

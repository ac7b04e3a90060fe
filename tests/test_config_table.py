"""One source for configuration: the table in byteps/common/variables.py against the code
that reads the environment, Config's defaults, bpslaunch --help and docs/configuration.md."""
from __future__ import annotations

import dataclasses
import re

import pytest

from byteps.common import config as config_mod
from byteps.common import variables
from byteps.common.config import Config, ConfigError
from byteps.common.variables import VARIABLES, Var, doc_row, shown
from conftest import ROOT

DOC = ROOT / "docs" / "configuration.md"
# Config fields whose default is not the variable's: derived when the variable is unset
DERIVED = {"num_server", "root_uri", "root_port", "node_host"}


def _doc_rows() -> list[tuple[str, str]]:
    """(variable, default) of every row of docs/configuration.md's variables table."""
    text = DOC.read_text()
    start = text.index("| variable | default | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[1].replace("`", "")))
    return rows


def test_docs_list_every_variable_with_its_default():
    rows = _doc_rows()
    problems = []
    names = [n for n, _ in rows]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{name} has {names.count(name)} rows; keep one")
    documented = dict(rows)
    for v in VARIABLES:
        if v.name not in documented:
            problems.append(f"{v.name} is missing; add this row (the meaning may say more):\n"
                            f"    {doc_row(v)}")
        elif documented[v.name] != shown(v):
            problems.append(f"{v.name}: the row says the default is {documented[v.name]!r}, "
                            f"byteps/common/variables.py says {shown(v)!r}; make the row's "
                            f"default column: {shown(v)}")
    for name in documented:
        if name not in variables.BY_NAME:
            problems.append(f"{name} is documented but nothing reads it (not in VARIABLES of "
                            f"byteps/common/variables.py): remove its row, or add it there")
    assert not problems, "docs/configuration.md's variables table:\n" + "\n".join(problems)


def test_every_variable_the_code_names_is_in_the_table():
    """A BYTEPS_*/DMLC_* name in byteps/ is in the table or is a known name of the original."""
    ignored = config_mod.ORIGINAL_ONLY | config_mod.ORIGINAL_NOT_NEEDED
    seen: dict[str, str] = {}
    for path in sorted((ROOT / "byteps").rglob("*.py")):
        for name in re.findall(r"[\"']((?:BYTEPS|DMLC)_[A-Z0-9_]*[A-Z0-9])[\"']",
                               path.read_text()):
            seen.setdefault(name, str(path.relative_to(ROOT)))
    missing = [f"{name} (read in {where}): add a line to VARIABLES in "
               f"byteps/common/variables.py, e.g. "
               f"V(\"{name}\", \"<default>\", int, \"<what it does>\", field=\"<cfg attribute>\") "
               f"(then test_docs_list_every_variable_with_its_default names the docs row)"
               for name, where in sorted(seen.items())
               if name not in variables.BY_NAME and name not in ignored]
    assert not missing, "\n".join(missing)


def test_config_defaults_are_the_tables():
    plain, real = Config(), Config.from_env({}, warn_unknown=False)
    fields = {f.name for f in dataclasses.fields(Config)}
    for v in VARIABLES:
        if v.field is None:
            continue
        assert v.field in fields, v
        if v.field in DERIVED:
            continue
        want = variables.default(v.name)
        assert getattr(plain, v.field) == want, (v.name, getattr(plain, v.field), want)
        if v.field not in ("role", "local_size"):
            assert getattr(real, v.field) == want, (v.name, getattr(real, v.field), want)
    # the defaults of variables that set no field directly
    assert real.log_level == config_mod.LOG_LEVELS[variables.default("BYTEPS_LOG_LEVEL")]
    assert real.local_reduce == config_mod._local_reduce(variables.default("BYTEPS_LOCAL_REDUCE"))


def test_a_new_variable_is_one_line():
    """A table row with ``field=`` becomes a parsed, validated Config attribute."""
    knob = Var("BYTEPS_TEST_NEW_KNOB", "5", int, "a knob", lo=1, hi=9, field="new_knob")
    table = VARIABLES + (knob,)
    old_by_name = dict(variables.BY_NAME)
    variables.BY_NAME[knob.name] = knob
    try:
        class Cfg(Config):
            pass
        Cfg = dataclasses.dataclass(frozen=True)(config_mod._with_table(Cfg, table))
        assert Cfg().new_knob == 5 and Cfg.from_env({}).new_knob == 5
        assert Cfg.from_env({"BYTEPS_TEST_NEW_KNOB": "7"}, warn_unknown=False).new_knob == 7
        with pytest.raises(ConfigError, match=r"BYTEPS_TEST_NEW_KNOB='12' is invalid: must be "
                                              r"<= 9 \(example: BYTEPS_TEST_NEW_KNOB=5\)"):
            Cfg.from_env({"BYTEPS_TEST_NEW_KNOB": "12"}, warn_unknown=False)
        assert "BYTEPS_TEST_NEW_KNOB" in doc_row(knob) and "| 5 |" in doc_row(knob)
    finally:
        variables.BY_NAME.clear()
        variables.BY_NAME.update(old_by_name)


@pytest.mark.parametrize("name,raw,message", [
    ("BYTEPS_FUSION_BYTES", "-1", "must be >= 0"),
    ("BYTEPS_SCHEDULING_CREDIT", "x", "not an integer"),
    ("BYTEPS_HEARTBEAT_INTERVAL", "0.01", "must be in [0.05, inf]"),
    ("BYTEPS_ENABLE_IPC", "maybe", "expected 0 or 1"),
    ("BYTEPS_TEST_DROP_RATE", "0.95", "must be in [0.0, 0.9]"),
])
def test_values_are_checked_by_the_table(name, raw, message):
    with pytest.raises(ConfigError, match=re.escape(f"{name}={raw!r} is invalid: {message}")):
        Config.from_env({name: raw}, warn_unknown=False)
    with pytest.raises(ConfigError, match=re.escape(message)):
        variables.value(name, {name: raw})
    assert variables.value(name, {}) == variables.default(name)


def test_help_and_the_launchers_defaults_are_the_tables():
    import os

    from byteps.launcher import envhelp, liveview
    text = envhelp.env_help()
    for v in VARIABLES:
        if v.help:
            assert re.search(rf"^  {v.name} +\[{re.escape(shown(v))}\]", text, re.M), v.name
    assert liveview.DEFAULT_INTERVAL_S == variables.default("BYTEPS_LIVE_INTERVAL_S")
    # transport sits below the table (imports nothing of ours) and keeps its own fallback
    from byteps.transport import shm
    if os.path.isdir(variables.default("BYTEPS_SHM_DIR")):
        assert shm.shm_dir(None) == variables.default("BYTEPS_SHM_DIR")


def test_no_default_is_written_outside_the_table():
    """Reads that carry their own default (``e.int("BYTEPS_X", 4, ...)``,
    ``os.environ.get("BYTEPS_X", "4")``) would be a second source of it."""
    pattern = re.compile(r"""(?:\be\.(?:int|float|bool|str)|environ\.get|getenv)\(\s*["']"""
                         r"""((?:BYTEPS|DMLC)_[A-Z0-9_]+)["']\s*,\s*(?!required)[^)\s]""")
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}... -> give {m.group(1)}'s default in "
             f"byteps/common/variables.py and read it with e.get({m.group(1)!r}) (in Config) "
             f"or variables.value({m.group(1)!r}, env)"
             for path in sorted((ROOT / "byteps").rglob("*.py"))
             for m in pattern.finditer(path.read_text())]
    assert not found, "\n".join(found)


def test_every_variable_the_original_reads_is_known():
    """Every BYTEPS_*/DMLC_* name the original BytePS reads (github.com/bytedance/byteps at
    f5df52fe, its byteps/ and launcher/) is read here or known to have no effect: setting
    one is never "unknown ... did you mean"."""
    original = {
        "BYTEPS_BUILT_IN_HASH_COEF", "BYTEPS_CPU_BLACKLIST", "BYTEPS_DEBUG_SAMPLE_TENSOR",
        "BYTEPS_ENABLE_ASYNC", "BYTEPS_ENABLE_GDB", "BYTEPS_ENABLE_MIXED_MODE",
        "BYTEPS_FORCE_DISTRIBUTED", "BYTEPS_GLOBAL_RANK", "BYTEPS_KEY_HASH_FN",
        "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_LOG_HIDE_TIME",
        "BYTEPS_LOG_LEVEL", "BYTEPS_MIN_COMPRESS_BYTES", "BYTEPS_MIXED_MODE_BOUND",
        "BYTEPS_MULTITHREADED_CPU", "BYTEPS_NCCL_GROUP_SIZE", "BYTEPS_NCCL_NUM_RINGS",
        "BYTEPS_NUMA_DEFAULT_QUOTA", "BYTEPS_NUMA_ON", "BYTEPS_NUMA_ROOT_QUOTA",
        "BYTEPS_OMP_THREAD_PER_GPU", "BYTEPS_PARTITION_BYTES", "BYTEPS_PCIE_SWITCH_SIZE",
        "BYTEPS_REDUCE_ROOTS", "BYTEPS_SCHEDULING_CREDIT", "BYTEPS_SERVER_DEBUG",
        "BYTEPS_SERVER_DEBUG_KEY", "BYTEPS_SERVER_ENABLE_SCHEDULE", "BYTEPS_SERVER_ENGINE_BLOCKING",
        "BYTEPS_SERVER_ENGINE_THREAD", "BYTEPS_SOCKET_PATH", "BYTEPS_TELEMETRY_ON",
        "BYTEPS_THREADPOOL_SIZE", "BYTEPS_TRACE_DIR", "BYTEPS_TRACE_END_STEP",
        "BYTEPS_TRACE_ON", "BYTEPS_TRACE_START_STEP", "BYTEPS_VISIBLE_CPU_CORES",
        "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_PORT",
        "DMLC_PS_ROOT_URI", "DMLC_ROLE", "DMLC_WORKER_ID",
    }
    unknown, _ = config_mod.name_report({n: "1" for n in original})
    assert not unknown, unknown

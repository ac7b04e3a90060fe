"""Every ``BYTEPS_*``/``DMLC_*`` variable this implementation reads: the one source of its
default, type, range and meaning.

:class:`byteps.common.config.Config` takes its field defaults and its parsing from this
table, ``bpslaunch --help`` shows it, and ``tests/test_config_table.py`` checks
docs/configuration.md against it.  Adding a variable is one line in :data:`VARIABLES`:
with ``field=`` it becomes a validated attribute of ``Config`` (``cfg.<field>``, parsed by
its ``kind`` and range) without touching anything else; the test then says which row to
add to docs/configuration.md.

Imports nothing of ours (below :mod:`byteps.common.config`, beside the errors).
"""
from __future__ import annotations

import os
from typing import Mapping, NamedTuple

from byteps.common.errors import ConfigError

REQUIRED = "required when distributed"


class Var(NamedTuple):
    """One environment variable."""

    name: str
    default: str | None       # as written in the environment; None: unset
    kind: type                # int, float, bool or str: how the value is parsed
    doc: str                  # one line: what it does (bpslaunch --help)
    lo: float | None = None   # smallest accepted value (int, float)
    hi: float | None = None   # largest accepted value
    field: str | None = None  # the Config attribute it sets (None: read elsewhere)
    example: str | None = None  # for error messages (default: the default)
    shown: str | None = None  # the default as docs show it, when None means something
    help: bool = False        # listed by bpslaunch --help


V = Var
VARIABLES: tuple[Var, ...] = (
    V("DMLC_ROLE", "worker", str, "scheduler, server or worker", field="role", help=True),
    V("DMLC_NUM_WORKER", "1", int, "worker machines (hosts); size = hosts x local size", lo=1,
      field="num_worker", example="2", help=True),
    V("DMLC_NUM_SERVER", None, int, "servers", lo=1, hi=4096, field="num_server", example="2",
      shown=REQUIRED, help=True),
    V("DMLC_PS_ROOT_URI", None, str, "scheduler address", field="root_uri", example="10.0.0.1",
      shown=REQUIRED, help=True),
    V("DMLC_PS_ROOT_PORT", None, int, "scheduler port", lo=1, hi=65535, field="root_port",
      example="9000", shown=REQUIRED, help=True),
    V("DMLC_WORKER_ID", None, int, "index of this worker machine; ranks follow it", lo=0,
      field="worker_id", example="0", shown="registration order", help=True),
    V("DMLC_NODE_HOST", None, str, "address this node listens on", field="node_host",
      example="10.0.0.2", shown="route to the scheduler", help=True),
    V("DMLC_INTERFACE", None, str, "network interface whose IPv4 address to listen on",
      example="eth0", help=True),
    V("BYTEPS_LOCAL_RANK", "0", int, "this worker's index on its machine (bpslaunch sets it)",
      lo=0, field="local_rank"),
    V("BYTEPS_LOCAL_SIZE", "1", int, "workers on this machine (bpslaunch sets it)", lo=1,
      hi=1024, field="local_size", example="8", help=True),
    V("BYTEPS_PARTITION_BYTES", "4096000", int, "largest partition of a tensor", lo=1,
      hi=(1 << 63) - 1, field="partition_bytes", help=True),
    V("BYTEPS_SCHEDULING_CREDIT", "4", int, "partitions in flight per worker", lo=0, hi=1 << 20,
      field="scheduling_credit", help=True),
    V("BYTEPS_FUSION_BYTES", "65536", int, "partitions up to this size are fused", lo=0,
      field="fusion_bytes", help=True),
    V("BYTEPS_MIN_COMPRESS_BYTES", "65536", int, "smaller tensors travel uncompressed", lo=0,
      field="min_compress_bytes"),
    V("BYTEPS_SERVER_ENGINE_THREAD", "4", int, "summation threads per server (0: inline)",
      lo=0, hi=256,
      field="server_engine_threads", help=True),
    V("BYTEPS_ENABLE_ASYNC", "0", bool, "asynchronous training", field="enable_async",
      help=True),
    V("BYTEPS_SERVER_REPLICAS", "0", int, "backups of every key range (0 or 1)", lo=0, hi=1,
      example="1"),
    V("BYTEPS_AUTOTUNE", "1", bool, "tune partition size and credit while training",
      field="autotune"),
    V("BYTEPS_AUTOTUNE_LOG", None, str, "file for autotune's measurements",
      field="autotune_log", example="/tmp/autotune-{rank}.csv"),
    V("BYTEPS_AUTOTUNE_STEPS", "3", int, "steps measured before autotune chooses", lo=1,
      hi=1000, field="autotune_steps"),
    V("BYTEPS_ASYNC_STALENESS", None, int, "steps a worker may run ahead in async mode", lo=0,
      hi=1 << 30, field="async_staleness", example="2", shown="unbounded"),
    V("BYTEPS_ENABLE_IPC", "1", bool, "colocated payloads through shared memory",
      field="enable_ipc", help=True),
    V("BYTEPS_MALLOC_TUNE", "1", bool, "keep message buffers in the heap (glibc mallopt)",
      field="malloc_tune"),
    V("BYTEPS_TCP_CONGESTION", None, str, "TCP congestion control of byteps's connections",
      field="tcp_congestion", example="cubic", shown="cubic where the host's is bbr"),
    V("BYTEPS_ENABLE_PEERS", "1", bool, "workers listen for peer messages (decentralized)",
      field="enable_peers"),
    V("BYTEPS_PEER_PORT", "0", int, "port a worker listens on for peers (0: any free port)",
      lo=0, hi=65535, field="peer_port", example="9200"),
    V("BYTEPS_FORCE_DISTRIBUTED", "0", bool, "use servers with one worker",
      field="force_distributed", help=True),
    V("BYTEPS_LOCAL_REDUCE", "1", str, "0, 1 (= root) or slice", help=True),
    V("BYTEPS_PCIE_SWITCH_SIZE", None, int, "local ranks that reduce together first", lo=1,
      hi=1024, field="pcie_switch_size", example="4", shown="from the topology"),
    V("BYTEPS_NUMA_ON", None, bool, "bind workers to NUMA nodes", field="numa_on",
      example="1", shown="1 where the machine has > 1 NUMA node", help=True),
    V("BYTEPS_SHM_DIR", "/dev/shm", str, "shared-memory folder", field="shm_dir", help=True),
    V("BYTEPS_LOG_LEVEL", "WARNING", str, "TRACE, DEBUG, INFO, WARNING, ERROR, FATAL",
      help=True),
    V("BYTEPS_STALL_WARNING_S", "60", float, "warn when a round waits this long", lo=0.1,
      field="stall_warning_s", help=True),
    V("BYTEPS_STALL_SHUTDOWN_S", None, float, "end the job when a round waits this long",
      lo=0.1, field="stall_shutdown_s", example="300", help=True),
    V("BYTEPS_COLLECTIVE_TIMEOUT_S", None, float, "a rank waiting this long in one "
      "collective raises and leaves the membership (the others fail naming it)", lo=0.1,
      field="collective_timeout_s", example="300"),
    V("BYTEPS_STARTUP_TIMEOUT", "60", float, "seconds to wait for every node", lo=0.5,
      field="startup_timeout", help=True),
    V("BYTEPS_REINIT_WAIT_S", "2", float, "seconds to wait for a re-init after all left",
      lo=0.0, field="reinit_wait_s"),
    V("BYTEPS_RESTART_COUNT", "0", int, "restarts so far (--max-restarts sets it)", lo=0,
      hi=32767, field="restart_count", example="1", help=True),
    V("BYTEPS_MIN_WORKERS", None, int, "elastic: the job goes on with this many workers (the "
      "scheduler's; --min-workers sets it)", lo=1, example="2", shown="not elastic",
      help=True),
    V("BYTEPS_MAX_WORKERS", None, int, "elastic: most workers let in (--max-workers)", lo=1,
      example="8", shown="unbounded"),
    V("BYTEPS_ELASTIC_TIMEOUT", None, float, "elastic: seconds below BYTEPS_MIN_WORKERS "
      "before the job ends", lo=0.5, example="60", shown="BYTEPS_STARTUP_TIMEOUT"),
    V("BYTEPS_HEARTBEAT_INTERVAL", "1", float, "seconds between heartbeats", lo=0.05,
      field="heartbeat_interval", help=True),
    V("BYTEPS_HEARTBEAT_TIMEOUT", "10", float, "silence that means dead", lo=0.2,
      field="heartbeat_timeout", help=True),
    V("BYTEPS_RESEND_TIMEOUT_S", "1", float, "first resend of a late partition", lo=0.01,
      field="resend_timeout_s"),
    V("BYTEPS_JOB_ID", "byteps", str, "job identity", field="job_id", example="myjob",
      help=True),
    V("BYTEPS_JOB_SECRET", None, str, "authenticates messages", example="<random hex>",
      shown="required on clusters (standalone: random)", help=True),
    V("BYTEPS_AUTH_DISABLE", "0", bool, "1: no message authentication (trusted networks)",
      field="auth_disable"),
    V("BYTEPS_MAX_MSG_BYTES", "1073741824", int, "largest message a server accepts",
      lo=1 << 16, field="max_msg_bytes"),
    V("BYTEPS_SERVER_PORT", "0", int, "port servers listen on (0: any free port)", lo=0,
      hi=65535, field="server_port", example="9100"),
    V("BYTEPS_EMULATED_HOST", None, str, "test knob: the host this worker pretends to be on",
      example="host0"),
    V("BYTEPS_TEST_DROP_RATE", "0", float, "test knob: fraction of DATA/RESULT dropped",
      lo=0.0, hi=0.9, field="test_drop_rate", example="0.05"),
    V("BYTEPS_TEST_SERVER_CRASH", None, str, "test knob: server I answers one worker's round "
      ">= R, then SIGKILLs itself (I:R; R=-1: on a worker's first HELLO)", example="1:12"),
    V("BYTEPS_TEST_RECORD", None, str, "test knob: servers append each push to this file",
      example="/tmp/arrivals.txt"),
    V("BYTEPS_TRACE_ON", "0", bool, "write timelines (docs/timeline.md)", field="trace_on",
      help=True),
    V("BYTEPS_TRACE_DIR", "./traces", str, "where timelines go", field="trace_dir",
      help=True),
    V("BYTEPS_TRACE_START_STEP", "0", int, "first step recorded", lo=0,
      field="trace_start_step", example="10"),
    V("BYTEPS_TRACE_END_STEP", "1073741824", int, "last step recorded", lo=0,
      field="trace_end_step", example="20"),
    V("BYTEPS_TIMELINE", None, str, "rank 0 writes Horovod's timeline to this file as the "
      "job runs (HOROVOD_TIMELINE)", field="timeline", example="/tmp/timeline.json"),
    V("BYTEPS_TIMELINE_MARK_CYCLES", "0", bool, "CYCLE_START markers in that timeline",
      field="timeline_mark_cycles"),
    V("BYTEPS_TRACE_SAMPLE", "1", int, "trace one step in N (a bounded timeline for long "
      "jobs)", lo=1, example="100"),
    V("BYTEPS_DASHBOARD_PORT", None, int, "scheduler: serve the live dashboard on this port "
      "(0: any free port, logged)", lo=0, hi=65535, example="8265"),
    V("BYTEPS_METRICS_PORT", None, int, "Prometheus metrics port base", lo=0, hi=65534,
      example="9400"),
    V("BYTEPS_METRICS_HOST", None, str, "address of the metrics endpoint",
      example="127.0.0.1", shown="the node's job address"),
    V("BYTEPS_LIVE_INTERVAL_S", "30", float, "seconds between live status lines",
      example="30"),
)
BY_NAME: dict[str, Var] = {v.name: v for v in VARIABLES}
if len(BY_NAME) != len(VARIABLES):
    raise ImportError("byteps/common/variables.py lists a variable twice")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def example(name: str) -> str:
    """A good value of ``name`` for error messages."""
    v = BY_NAME.get(name)
    if v is None:
        return ""
    return v.example if v.example is not None else (v.default or "")


def shown(v: Var) -> str:
    """The default as docs/configuration.md and ``bpslaunch --help`` show it."""
    if v.shown is not None:
        return v.shown
    return "unset" if v.default is None else v.default


def bad(name: str, value: object, why: str) -> ConfigError:
    """The error for a malformed value: names the variable, the value and a good one."""
    return ConfigError(f"{name}={value!r} is invalid: {why} (example: {name}={example(name)})")


def parse(v: Var, raw: str | None):
    """``raw`` (None or "": unset, the table's default) as a value of ``v.kind`` within
    ``[v.lo, v.hi]``; raises ConfigError naming the variable."""
    if raw is None or raw == "":
        if v.default is None:
            return None
        raw = v.default
    if v.kind is str:
        return raw
    s = raw.strip()
    if v.kind is bool:
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise bad(v.name, raw, "expected 0 or 1")
    if v.kind is int:
        try:
            x = int(s)
        except ValueError:
            raise bad(v.name, raw, "not an integer") from None
        if v.lo is not None and x < v.lo:
            raise bad(v.name, raw, f"must be >= {v.lo}")
        if v.hi is not None and x > v.hi:
            raise bad(v.name, raw, f"must be <= {v.hi}")
        return x
    try:
        f = float(s)
    except ValueError:
        raise bad(v.name, raw, "not a number") from None
    lo = 0.0 if v.lo is None else v.lo
    if f < lo or (v.hi is not None and f > v.hi) or f != f:
        raise bad(v.name, raw, f"must be in [{lo}, {v.hi if v.hi is not None else 'inf'}]")
    return f


def value(name: str, env: Mapping[str, str] | None = None):
    """The validated value of ``name`` in ``env`` (default os.environ), or its default."""
    env = os.environ if env is None else env
    return parse(BY_NAME[name], env.get(name))


def default(name: str):
    """The parsed default of ``name`` (None when unset by default)."""
    return parse(BY_NAME[name], None)


def doc_row(v: Var) -> str:
    """The row docs/configuration.md has for ``v`` (the meaning may say more)."""
    return f"| `{v.name}` | {shown(v)} | {v.doc} |"

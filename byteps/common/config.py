"""One configuration object, built from the environment and validated once.

Every role (scheduler, server, worker) calls :func:`Config.from_env`.  A
missing or malformed value raises :class:`ConfigError` naming the variable,
the value that was seen and an example of a good one.  Unknown ``BYTEPS_*``
names produce a warning, so that typos are never silently ignored.
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import socket
import warnings
from typing import Mapping

from byteps.common import horovod_env
from byteps.common.errors import ConfigError
from byteps.common.variables import BY_NAME, VARIABLES, Var
from byteps.common.variables import default as _D
from byteps.common.variables import example as _example
from byteps.common.variables import parse as _parse

ROLES = ("worker", "server", "scheduler")
MSG_HEADROOM = 4096     # bytes of a message left for headers when partitions are capped
_PARTITION_WARNED: list[str] = []
log = logging.getLogger("byteps.config")
LOG_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
              "WARNING": logging.WARNING, "WARN": logging.WARNING,
              "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}

# Variables this implementation reads, with an example for error messages: the table in
# byteps/common/variables.py (defaults, types, ranges, meanings) is their one source.
KNOWN = {v.name: _example(v.name) for v in VARIABLES if v.name.startswith("BYTEPS_")}
# Names of the original BytePS that we accept without a warning (no effect).
ORIGINAL_ONLY = {
    "BYTEPS_ENABLE_GDB", "BYTEPS_NCCL_GROUP_SIZE", "BYTEPS_USE_HASH_KEY",
    "BYTEPS_KEY_HASH_FN", "BYTEPS_REDUCE_ROOTS", "BYTEPS_SERVER_ENABLE_SCHEDULE",
    "BYTEPS_NUMA_DEFAULT_QUOTA", "BYTEPS_OMP_THREAD_PER_GPU", "BYTEPS_VISIBLE_DEVICE",
    "BYTEPS_NCCL_NUM_RINGS", "BYTEPS_SERVER_KEY_TO_THREAD", "BYTEPS_ENABLE_MIXED_MODE",
    "BYTEPS_SERVER_DEBUG", "BYTEPS_SERVER_DEBUG_KEY",
    "BYTEPS_PHY_NODE_ID", "BYTEPS_THREADPOOL_SIZE", "BYTEPS_PARTITION_ALIGN",
    "BYTEPS_CPU_ONLY", "BYTEPS_ENABLE_CPU_REDUCER", "BYTEPS_SERVER_DIRECT_RESPONSE",
}


def _bad(name: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is invalid: {why} (example: {name}={_example(name)})")


_DMLC_EXAMPLES = {v.name: _example(v.name) for v in VARIABLES if v.name.startswith("DMLC_")}

# More names of the original BytePS (its docs/env.md, launcher and C++ core) and of
# ps-lite/dmlc-tracker: known, not needed here (no effect; bpslaunch notes them once).
ORIGINAL_NOT_NEEDED = {
    "BYTEPS_VISIBLE_CPU_CORES", "BYTEPS_CPU_BLACKLIST", "BYTEPS_MULTITHREADED_CPU",
    "BYTEPS_NUMA_ROOT_QUOTA", "BYTEPS_SERVER_MXNET_PATH", "BYTEPS_DEBUG_SAMPLE_TENSOR",
    "BYTEPS_DISABLE_P2P", "BYTEPS_DISABLE_CPU_ALLREDUCE", "BYTEPS_DISABLE_GPU_ALLREDUCE",
    "BYTEPS_BUILT_IN_HASH_COEF", "BYTEPS_SERVER_ENGINE_BLOCKING", "BYTEPS_SOCKET_PATH",
    "BYTEPS_SERVER_ENABLE_PROFILE", "BYTEPS_SERVER_PROFILE_OUTPUT_PATH",
    "BYTEPS_SERVER_KEY_TO_PROFILE", "BYTEPS_PUSH_THREAD", "BYTEPS_GLOBAL_RANK",
    "BYTEPS_MIXED_MODE_BOUND", "BYTEPS_TELEMETRY_ON", "BYTEPS_LOG_HIDE_TIME",
    "DMLC_PS_VAN_TYPE", "DMLC_PS_WATER_MARK", "DMLC_LOCAL", "DMLC_NUM_ATTEMPT",
    "DMLC_NODE_VHOST", "DMLC_USE_KUBERNETES", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER",
    "DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_RANK", "DMLC_ENABLE_RDMA", "DMLC_ENABLE_UCX",
}
# Transports of the original that this build does not have (any value but 0 is an error).
_NO_TRANSPORT = {"DMLC_ENABLE_RDMA": "RDMA", "DMLC_ENABLE_UCX": "UCX"}
# bpslaunch sets this once it has reported unknown names: its children stay quiet.
NAMES_CHECKED = "BPSLAUNCH_NAMES_CHECKED"


def name_report(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(warnings for unknown BYTEPS_*/DMLC_* names with a hint, names of the original
    BytePS or ps-lite set in ``env`` that have no effect here)."""
    unknown, original = [], []
    for name in sorted(env):
        if not name.startswith(("BYTEPS_", "DMLC_")):
            continue
        known = KNOWN if name.startswith("BYTEPS_") else _DMLC_EXAMPLES
        if name in known:
            continue
        if name in ORIGINAL_ONLY or name in ORIGINAL_NOT_NEEDED:
            original.append(name)
            continue
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        kind = "BytePS" if name.startswith("BYTEPS_") else "DMLC"
        unknown.append(f"unknown {kind} variable {name} is ignored{hint}")
    return unknown, original


def _check_transport(env: Mapping[str, str]) -> None:
    for name, what in _NO_TRANSPORT.items():
        v = (env.get(name) or "0").strip().lower()
        if v not in ("0", "false", "no", "off"):
            raise ConfigError(f"{name}={env[name]!r}: {what} is not available in this build; "
                              f"use tcp (unset {name} or set {name}=0; colocated processes "
                              f"already use shared memory)")


class _Env:
    def __init__(self, env: Mapping[str, str]):
        self.env = env

    def str(self, name: str, default: str | None = None, required: bool = False) -> str | None:
        v = self.env.get(name)
        if v is None or v == "":
            if required:
                ex = _DMLC_EXAMPLES.get(name) or KNOWN.get(name, "")
                raise ConfigError(f"{name} is not set; it is required for a distributed "
                                  f"BytePS job (example: {name}={ex})")
            return default
        return v

    def int(self, name: str, default: int | None = None, lo: int | None = None,
            hi: int | None = None, required: bool = False) -> int | None:
        raw = self.str(name, None, required)
        if raw is None:
            return default
        try:
            v = int(raw.strip())
        except ValueError:
            raise _bad(name, raw, "not an integer") from None
        if lo is not None and v < lo:
            raise _bad(name, raw, f"must be >= {lo}")
        if hi is not None and v > hi:
            raise _bad(name, raw, f"must be <= {hi}")
        return v

    def float(self, name: str, default: float | None, lo: float = 0.0,
              hi: float | None = None) -> float | None:
        raw = self.str(name)
        if raw is None:
            return default
        try:
            v = float(raw.strip())
        except ValueError:
            raise _bad(name, raw, "not a number") from None
        if v < lo or (hi is not None and v > hi) or v != v:
            raise _bad(name, raw, f"must be in [{lo}, {hi if hi is not None else 'inf'}]")
        return v

    def bool(self, name: str, default: bool = False) -> bool:
        raw = self.str(name)
        if raw is None:
            return default
        s = raw.strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise _bad(name, raw, "expected 0 or 1")

    def get(self, name: str, required: bool = False):
        """``name`` parsed by its row of the table (byteps/common/variables.py): its type,
        range and default."""
        return _parse(BY_NAME[name], self.str(name, None, required))


def _with_table(cls, table: tuple[Var, ...] = VARIABLES):
    """Adds to ``cls`` a field (default: the table's) for every variable of ``table`` with a
    ``field`` that ``cls`` does not declare, so that a new variable is one line in the table;
    ``Config.from_env`` reads those by the table too (``cls._table_only``)."""
    if "__annotations__" not in cls.__dict__:
        cls.__annotations__ = {}
    declared = cls.__dict__["__annotations__"]
    known = {f for base in cls.__mro__ for f in base.__dict__.get("__annotations__", {})}
    added = []
    for v in table:
        if v.field and v.field not in known:
            declared[v.field] = f"{v.kind.__name__} | None"
            setattr(cls, v.field, _parse(v, None))
            added.append(v)
    cls._table_only = getattr(cls, "_table_only", ()) + tuple(added)
    return cls


@dataclasses.dataclass(frozen=True)
@_with_table
class Config:
    """Validated settings of one BytePS process (see docs/configuration.md).  Field
    defaults come from the table in byteps/common/variables.py."""

    role: str = _D("DMLC_ROLE")
    distributed: bool = False
    num_worker: int = _D("DMLC_NUM_WORKER")  # worker *hosts*
    num_server: int = 0
    root_uri: str = "127.0.0.1"
    root_port: int = 0
    worker_id: int | None = _D("DMLC_WORKER_ID")
    node_host: str = "127.0.0.1"
    local_rank: int = _D("BYTEPS_LOCAL_RANK")
    local_size: int = _D("BYTEPS_LOCAL_SIZE")
    partition_bytes: int = _D("BYTEPS_PARTITION_BYTES")
    scheduling_credit: int = _D("BYTEPS_SCHEDULING_CREDIT")
    server_engine_threads: int = _D("BYTEPS_SERVER_ENGINE_THREAD")
    enable_async: bool = _D("BYTEPS_ENABLE_ASYNC")
    async_staleness: int | None = _D("BYTEPS_ASYNC_STALENESS")  # None = unbounded
    force_distributed: bool = _D("BYTEPS_FORCE_DISTRIBUTED")
    log_level: int = logging.WARNING
    stall_warning_s: float = _D("BYTEPS_STALL_WARNING_S")
    stall_shutdown_s: float | None = _D("BYTEPS_STALL_SHUTDOWN_S")
    heartbeat_interval: float = _D("BYTEPS_HEARTBEAT_INTERVAL")
    heartbeat_timeout: float = _D("BYTEPS_HEARTBEAT_TIMEOUT")
    startup_timeout: float = _D("BYTEPS_STARTUP_TIMEOUT")
    # job ends this long after every worker left, if none re-inits
    reinit_wait_s: float = _D("BYTEPS_REINIT_WAIT_S")
    # bpslaunch --max-restarts: restarts so far (epoch base)
    restart_count: int = _D("BYTEPS_RESTART_COUNT")
    job_id: str = _D("BYTEPS_JOB_ID")
    job_secret: str | None = None
    auth_disable: bool = _D("BYTEPS_AUTH_DISABLE")
    resend_timeout_s: float = _D("BYTEPS_RESEND_TIMEOUT_S")
    max_msg_bytes: int = _D("BYTEPS_MAX_MSG_BYTES")
    enable_ipc: bool = _D("BYTEPS_ENABLE_IPC")
    enable_peers: bool = _D("BYTEPS_ENABLE_PEERS")  # workers listen for peers
    malloc_tune: bool = _D("BYTEPS_MALLOC_TUNE")    # byteps/common/malloc.py
    host_id: str = ""
    test_drop_rate: float = _D("BYTEPS_TEST_DROP_RATE")
    fusion_bytes: int = _D("BYTEPS_FUSION_BYTES")
    partition_explicit: bool = False   # BYTEPS_PARTITION_BYTES was set (autotune keeps it)
    engine_threads_explicit: bool = False   # BYTEPS_SERVER_ENGINE_THREAD was set
    credit_explicit: bool = False      # BYTEPS_SCHEDULING_CREDIT was set
    credit_window: int = 0         # bytes in flight chosen by autotune (0: credit x partition)
    server_port: int = _D("BYTEPS_SERVER_PORT")
    trace_on: bool = _D("BYTEPS_TRACE_ON")
    trace_dir: str = _D("BYTEPS_TRACE_DIR")
    trace_start_step: int = _D("BYTEPS_TRACE_START_STEP")
    trace_end_step: int = _D("BYTEPS_TRACE_END_STEP")
    local_reduce: str = "root"     # BYTEPS_LOCAL_REDUCE: off | root | slice
    pcie_switch_size: int | None = _D("BYTEPS_PCIE_SWITCH_SIZE")
    # None: on where the machine has more than one NUMA node
    numa_on: bool | None = _D("BYTEPS_NUMA_ON")
    shm_dir: str = _D("BYTEPS_SHM_DIR")
    min_compress_bytes: int = _D("BYTEPS_MIN_COMPRESS_BYTES")  # smaller tensors travel uncompressed
    server_replicas: int = _D("BYTEPS_SERVER_REPLICAS")   # backups per key range (0 or 1)

    @property
    def credit_bytes(self) -> int:
        """Bytes allowed in flight per worker: autotune's window, else credit partitions x
        partition size."""
        if self.credit_window:
            return self.credit_window
        return max(1, self.scheduling_credit) * self.partition_size()

    def partition_size(self, nbytes: int = 0, name: str = "") -> int:
        """The partition size for a tensor of ``nbytes``: BYTEPS_PARTITION_BYTES, at most what
        one message may carry (BYTEPS_MAX_MSG_BYTES less header room, 8-byte aligned).  A
        partition larger than a tensor means no partitioning.  Warns once per process when a
        tensor is actually cut smaller than asked (the only case where the cap matters)."""
        cap = max(8, (self.max_msg_bytes - MSG_HEADROOM) // 8 * 8)
        if self.partition_bytes <= cap:
            return self.partition_bytes
        if nbytes > cap and not _PARTITION_WARNED:
            _PARTITION_WARNED.append(name)
            log.warning("tensor %r (%d bytes) is cut into partitions of %d bytes, not "
                        "BYTEPS_PARTITION_BYTES=%d: one message carries at most "
                        "BYTEPS_MAX_MSG_BYTES=%d", name, nbytes, cap, self.partition_bytes,
                        self.max_msg_bytes)
        return cap

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 role: str | None = None, warn_unknown: bool = True) -> "Config":
        """Build and validate the configuration from ``environ`` (default os.environ)."""
        # Horovod's variables with an equivalent set it, unless that one is set (horovod_env)
        env = horovod_env.apply(os.environ if environ is None else environ)
        e = _Env(env)
        _check_transport(env)
        if warn_unknown:
            _warn_unknown(env)
        role = role or e.get("DMLC_ROLE")
        if role not in ROLES:
            raise _bad("DMLC_ROLE", role, f"must be one of {', '.join(ROLES)}")
        force = e.get("BYTEPS_FORCE_DISTRIBUTED")
        local_size = e.get("BYTEPS_LOCAL_SIZE")
        local_rank = e.get("BYTEPS_LOCAL_RANK")
        if local_rank >= local_size:
            raise ConfigError(f"BYTEPS_LOCAL_RANK={local_rank} must be < BYTEPS_LOCAL_SIZE="
                              f"{local_size} (example: BYTEPS_LOCAL_RANK=0 BYTEPS_LOCAL_SIZE=8)")
        any_dmlc = any(k in env for k in ("DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                                          "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"))
        num_worker = e.get("DMLC_NUM_WORKER", required=role != "worker" or any_dmlc)
        distributed = role != "worker" or force or num_worker * local_size > 1 or any_dmlc
        kw: dict = {}
        if distributed:
            kw["num_server"] = e.get("DMLC_NUM_SERVER", required=True)
            kw["root_uri"] = e.get("DMLC_PS_ROOT_URI", required=True)
            kw["root_port"] = e.get("DMLC_PS_ROOT_PORT", required=True)
        worker_id = e.get("DMLC_WORKER_ID")
        if worker_id is not None and worker_id >= num_worker:
            raise _bad("DMLC_WORKER_ID", worker_id, f"must be < DMLC_NUM_WORKER={num_worker}")
        root_uri = kw.get("root_uri", "127.0.0.1")
        node_host = e.get("DMLC_NODE_HOST") or _interface_ip(e.get("DMLC_INTERFACE")) \
            or _route_ip(root_uri)
        lvl = e.get("BYTEPS_LOG_LEVEL").upper()
        if lvl not in LOG_LEVELS:
            raise _bad("BYTEPS_LOG_LEVEL", lvl, "one of " + ", ".join(LOG_LEVELS))
        secret = e.get("BYTEPS_JOB_SECRET")
        auth_disable = e.get("BYTEPS_AUTH_DISABLE")
        if auth_disable:
            secret = None
        hb_int = e.get("BYTEPS_HEARTBEAT_INTERVAL")
        hb_to = e.get("BYTEPS_HEARTBEAT_TIMEOUT")
        if hb_to <= hb_int:
            raise _bad("BYTEPS_HEARTBEAT_TIMEOUT", hb_to,
                       f"must exceed BYTEPS_HEARTBEAT_INTERVAL={hb_int}")
        host_id = e.get("BYTEPS_EMULATED_HOST") or (
            f"id{worker_id}" if worker_id is not None else node_host + "/" + socket.gethostname())
        if worker_id is None and local_size == 1 and not e.get("BYTEPS_EMULATED_HOST"):
            # without DMLC_WORKER_ID, separate single-worker launches on one machine are
            # separate worker "hosts" (not one host registering local rank 0 twice)
            host_id += f"/{os.getpid()}"
        kw.update({v.field: e.get(v.name) for v in cls._table_only})
        kw["tcp_congestion"] = _tcp_congestion(kw["tcp_congestion"])
        return cls(
            role=role, distributed=distributed, num_worker=num_worker,
            worker_id=worker_id, node_host=node_host,
            local_rank=local_rank, local_size=local_size,
            partition_bytes=e.get("BYTEPS_PARTITION_BYTES"),
            scheduling_credit=e.get("BYTEPS_SCHEDULING_CREDIT"),
            server_engine_threads=e.get("BYTEPS_SERVER_ENGINE_THREAD"),
            enable_async=e.get("BYTEPS_ENABLE_ASYNC"), force_distributed=force,
            async_staleness=e.get("BYTEPS_ASYNC_STALENESS"),
            log_level=LOG_LEVELS[lvl],
            stall_warning_s=e.get("BYTEPS_STALL_WARNING_S"),
            stall_shutdown_s=e.get("BYTEPS_STALL_SHUTDOWN_S"),
            heartbeat_interval=hb_int, heartbeat_timeout=hb_to,
            startup_timeout=e.get("BYTEPS_STARTUP_TIMEOUT"),
            reinit_wait_s=e.get("BYTEPS_REINIT_WAIT_S"),
            restart_count=e.get("BYTEPS_RESTART_COUNT"),
            job_id=e.get("BYTEPS_JOB_ID"), job_secret=secret,
            auth_disable=auth_disable,
            resend_timeout_s=e.get("BYTEPS_RESEND_TIMEOUT_S"),
            max_msg_bytes=e.get("BYTEPS_MAX_MSG_BYTES"),
            enable_ipc=e.get("BYTEPS_ENABLE_IPC"), host_id=host_id,
            enable_peers=e.get("BYTEPS_ENABLE_PEERS"),
            malloc_tune=e.get("BYTEPS_MALLOC_TUNE"),
            test_drop_rate=e.get("BYTEPS_TEST_DROP_RATE"),
            fusion_bytes=e.get("BYTEPS_FUSION_BYTES"),
            partition_explicit=e.str("BYTEPS_PARTITION_BYTES") is not None,
            engine_threads_explicit=e.str("BYTEPS_SERVER_ENGINE_THREAD") is not None,
            credit_explicit=e.str("BYTEPS_SCHEDULING_CREDIT") is not None,
            server_port=e.get("BYTEPS_SERVER_PORT"),
            trace_on=e.get("BYTEPS_TRACE_ON"),
            trace_dir=e.get("BYTEPS_TRACE_DIR"),
            trace_start_step=e.get("BYTEPS_TRACE_START_STEP"),
            trace_end_step=e.get("BYTEPS_TRACE_END_STEP"),
            local_reduce=_local_reduce(e.get("BYTEPS_LOCAL_REDUCE")),
            pcie_switch_size=e.get("BYTEPS_PCIE_SWITCH_SIZE"),
            numa_on=e.get("BYTEPS_NUMA_ON"),
            shm_dir=e.get("BYTEPS_SHM_DIR"),
            min_compress_bytes=e.get("BYTEPS_MIN_COMPRESS_BYTES"),
            server_replicas=_replicas(e, kw.get("num_server", 0)),
            **kw)


def _tcp_congestion(raw: str | None) -> str | None:
    """BYTEPS_TCP_CONGESTION: a congestion control this process's TCP connections may use
    (tried on an unconnected socket), or "host"; None: unset (byteps/transport/congestion.py
    chooses)."""
    name = (raw or "").strip()
    if not name:
        return None
    from byteps.transport import congestion
    if name == congestion.HOST:
        return name
    why = congestion.problem(name)
    if why:
        raise ConfigError(f"BYTEPS_TCP_CONGESTION={raw!r} cannot be used on "
                          f"{socket.gethostname()}: {why} (or set it to 'host' to keep the host's "
                          f"{congestion.host_default()})")
    return name


def _replicas(e: "_Env", num_server: int) -> int:
    """BYTEPS_SERVER_REPLICAS: 0 (default) or 1 (every key range has a backup on the next
    server; a server's death is survived, docs/fault_tolerance.md); needs 2+ servers."""
    n = e.get("BYTEPS_SERVER_REPLICAS")
    if n and 0 < num_server < 2:
        raise _bad("BYTEPS_SERVER_REPLICAS", n, f"a backup needs another server, but "
                   f"DMLC_NUM_SERVER={num_server}; start 2 or more servers or set "
                   f"BYTEPS_SERVER_REPLICAS=0")
    return n


def _local_reduce(raw: str) -> str:
    """BYTEPS_LOCAL_REDUCE: 0/off, 1/on (= root: local rank 0 is the host's only network
    client, measured fastest in benchmarks/local_reduce.py) or slice (local rank k pushes
    reduced slice k)."""
    v = raw.strip().lower()
    mode = {"0": "off", "off": "off", "false": "off", "no": "off", "1": "root", "on": "root",
            "true": "root", "yes": "root", "root": "root", "slice": "slice"}.get(v)
    if mode is None:
        raise _bad("BYTEPS_LOCAL_REDUCE", raw, "expected 0, 1, slice or root")
    return mode


def _warn_unknown(env: Mapping[str, str]) -> None:
    if env.get(NAMES_CHECKED):        # bpslaunch reported them once for the whole job
        return
    for text in name_report(env)[0]:
        warnings.warn(text, stacklevel=3)


def _interface_ip(iface: str | None) -> str | None:
    if not iface:
        return None
    import fcntl
    import struct
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError as exc:
        raise _bad("DMLC_INTERFACE", iface, f"no IPv4 address on that interface ({exc})") from None


def _route_ip(root_uri: str) -> str:
    """The local address used to reach the scheduler (loopback stays loopback)."""
    try:
        ip = socket.gethostbyname(root_uri)
    except OSError:
        return "127.0.0.1"
    if ip.startswith("127."):
        return "127.0.0.1"
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((ip, 9))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def scheduler_listen_host(uri: str) -> str:
    """The one address the scheduler listens on: the one DMLC_PS_ROOT_URI names (every
    node connects there).  A host name that resolves to Debian's 127.0.1.1 on its own
    machine is what other machines reach at the routed address, so listen there."""
    import socket
    try:
        ip = socket.gethostbyname(uri)
    except OSError:
        return uri
    if ip.startswith("127.") and ip != "127.0.0.1" and uri not in ("localhost", ip):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))      # no packet is sent; asks the routing table
                return s.getsockname()[0]
        except OSError:
            pass
    return ip

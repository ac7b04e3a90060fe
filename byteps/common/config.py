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

from byteps.common.errors import ConfigError

ROLES = ("worker", "server", "scheduler")
MSG_HEADROOM = 4096     # bytes of a message left for headers when partitions are capped
_PARTITION_WARNED: list[str] = []
log = logging.getLogger("byteps.config")
LOG_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
              "WARNING": logging.WARNING, "WARN": logging.WARNING,
              "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}

# Variables this implementation reads (with an example for error messages).
KNOWN = {
    "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "8",
    "BYTEPS_PARTITION_BYTES": "4096000", "BYTEPS_SCHEDULING_CREDIT": "4",
    "BYTEPS_SERVER_ENGINE_THREAD": "4", "BYTEPS_ENABLE_ASYNC": "0",
    "BYTEPS_FORCE_DISTRIBUTED": "0", "BYTEPS_LOG_LEVEL": "WARNING",
    "BYTEPS_STALL_WARNING_S": "60", "BYTEPS_STALL_SHUTDOWN_S": "300",
    "BYTEPS_HEARTBEAT_INTERVAL": "1", "BYTEPS_HEARTBEAT_TIMEOUT": "10",
    "BYTEPS_STARTUP_TIMEOUT": "60", "BYTEPS_REINIT_WAIT_S": "2", "BYTEPS_JOB_ID": "myjob",
    "BYTEPS_JOB_SECRET": "<random hex>", "BYTEPS_AUTH_DISABLE": "0",
    "BYTEPS_MAX_MSG_BYTES": "1073741824", "BYTEPS_ENABLE_IPC": "1",
    "BYTEPS_EMULATED_HOST": "host0", "BYTEPS_TEST_DROP_RATE": "0.05",
    "BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_DIR": "./traces",
    "BYTEPS_TRACE_START_STEP": "10", "BYTEPS_TRACE_END_STEP": "20",
    "BYTEPS_PCIE_SWITCH_SIZE": "4", "BYTEPS_NUMA_ON": "1",
    "BYTEPS_FUSION_BYTES": "65536", "BYTEPS_RESEND_TIMEOUT_S": "1",
    "BYTEPS_SERVER_PORT": "9100", "BYTEPS_LOCAL_REDUCE": "1",
    "BYTEPS_SHM_DIR": "/dev/shm", "BYTEPS_TEST_RECORD": "/tmp/arrivals.txt",
    "BYTEPS_MIN_COMPRESS_BYTES": "65536", "BYTEPS_RESTART_COUNT": "1",
    "BYTEPS_ASYNC_STALENESS": "2",
    "BYTEPS_METRICS_PORT": "9400", "BYTEPS_METRICS_HOST": "127.0.0.1",
    "BYTEPS_LIVE_INTERVAL_S": "30", "BYTEPS_ENABLE_PEERS": "1",
}
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
    example = KNOWN.get(name) or _DMLC_EXAMPLES.get(name, "")
    return ConfigError(f"{name}={value!r} is invalid: {why} (example: {name}={example})")


_DMLC_EXAMPLES = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2",
                  "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
                  "DMLC_WORKER_ID": "0", "DMLC_NODE_HOST": "10.0.0.2",
                  "DMLC_INTERFACE": "eth0"}

# More names of the original BytePS (its docs/env.md, launcher and C++ core) and of
# ps-lite/dmlc-tracker: known, not needed here (no effect; bpslaunch notes them once).
ORIGINAL_NOT_NEEDED = {
    "BYTEPS_VISIBLE_CPU_CORES", "BYTEPS_CPU_BLACKLIST", "BYTEPS_MULTITHREADED_CPU",
    "BYTEPS_NUMA_ROOT_QUOTA", "BYTEPS_SERVER_MXNET_PATH", "BYTEPS_DEBUG_SAMPLE_TENSOR",
    "BYTEPS_DISABLE_P2P", "BYTEPS_DISABLE_CPU_ALLREDUCE", "BYTEPS_DISABLE_GPU_ALLREDUCE",
    "BYTEPS_BUILT_IN_HASH_COEF", "BYTEPS_SERVER_ENGINE_BLOCKING", "BYTEPS_SOCKET_PATH",
    "BYTEPS_SERVER_ENABLE_PROFILE", "BYTEPS_SERVER_PROFILE_OUTPUT_PATH",
    "BYTEPS_SERVER_KEY_TO_PROFILE", "BYTEPS_PUSH_THREAD",
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


@dataclasses.dataclass(frozen=True)
class Config:
    """Validated settings of one BytePS process (see docs/configuration.md)."""

    role: str = "worker"
    distributed: bool = False
    num_worker: int = 1            # worker *hosts* (DMLC_NUM_WORKER)
    num_server: int = 0
    root_uri: str = "127.0.0.1"
    root_port: int = 0
    worker_id: int | None = None
    node_host: str = "127.0.0.1"
    local_rank: int = 0
    local_size: int = 1
    partition_bytes: int = 4096000
    scheduling_credit: int = 4
    server_engine_threads: int = 4
    enable_async: bool = False
    async_staleness: int | None = None   # BYTEPS_ASYNC_STALENESS: None = unbounded
    force_distributed: bool = False
    log_level: int = logging.WARNING
    stall_warning_s: float = 60.0
    stall_shutdown_s: float | None = None
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    startup_timeout: float = 60.0
    reinit_wait_s: float = 2.0     # job ends this long after every worker left, if none re-inits
    restart_count: int = 0         # bpslaunch --max-restarts: restarts so far (epoch base)
    job_id: str = "byteps"
    job_secret: str | None = None
    auth_disable: bool = False
    resend_timeout_s: float = 1.0
    max_msg_bytes: int = 1 << 30
    enable_ipc: bool = True
    enable_peers: bool = True      # BYTEPS_ENABLE_PEERS: workers listen for peers
    host_id: str = ""
    test_drop_rate: float = 0.0
    fusion_bytes: int = 65536
    server_port: int = 0
    trace_on: bool = False
    trace_dir: str = "./traces"
    trace_start_step: int = 0
    trace_end_step: int = 1 << 30
    local_reduce: str = "root"     # BYTEPS_LOCAL_REDUCE: off | root | slice
    pcie_switch_size: int | None = None
    numa_on: bool | None = None    # None: on where the machine has more than one NUMA node
    shm_dir: str = "/dev/shm"
    min_compress_bytes: int = 65536   # smaller tensors travel uncompressed

    @property
    def credit_bytes(self) -> int:
        """Bytes allowed in flight per worker (credit partitions x partition size)."""
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
        env = dict(os.environ if environ is None else environ)
        e = _Env(env)
        _check_transport(env)
        if warn_unknown:
            _warn_unknown(env)
        role = role or e.str("DMLC_ROLE", "worker")
        if role not in ROLES:
            raise _bad("DMLC_ROLE", role, f"must be one of {', '.join(ROLES)}")
        force = e.bool("BYTEPS_FORCE_DISTRIBUTED")
        local_size = e.int("BYTEPS_LOCAL_SIZE", 1, lo=1, hi=1024)
        local_rank = e.int("BYTEPS_LOCAL_RANK", 0, lo=0)
        if local_rank >= local_size:
            raise ConfigError(f"BYTEPS_LOCAL_RANK={local_rank} must be < BYTEPS_LOCAL_SIZE="
                              f"{local_size} (example: BYTEPS_LOCAL_RANK=0 BYTEPS_LOCAL_SIZE=8)")
        any_dmlc = any(k in env for k in ("DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                                          "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"))
        num_worker = e.int("DMLC_NUM_WORKER", 1, lo=1, required=role != "worker" or any_dmlc)
        distributed = role != "worker" or force or num_worker * local_size > 1 or any_dmlc
        kw: dict = {}
        if distributed:
            kw["num_server"] = e.int("DMLC_NUM_SERVER", required=True, lo=1, hi=4096)
            kw["root_uri"] = e.str("DMLC_PS_ROOT_URI", required=True)
            kw["root_port"] = e.int("DMLC_PS_ROOT_PORT", required=True, lo=1, hi=65535)
        worker_id = e.int("DMLC_WORKER_ID", None, lo=0)
        if worker_id is not None and worker_id >= num_worker:
            raise _bad("DMLC_WORKER_ID", worker_id, f"must be < DMLC_NUM_WORKER={num_worker}")
        root_uri = kw.get("root_uri", "127.0.0.1")
        node_host = e.str("DMLC_NODE_HOST") or _interface_ip(e.str("DMLC_INTERFACE")) \
            or _route_ip(root_uri)
        lvl = (e.str("BYTEPS_LOG_LEVEL", "WARNING") or "WARNING").upper()
        if lvl not in LOG_LEVELS:
            raise _bad("BYTEPS_LOG_LEVEL", lvl, "one of " + ", ".join(LOG_LEVELS))
        secret = e.str("BYTEPS_JOB_SECRET")
        auth_disable = e.bool("BYTEPS_AUTH_DISABLE")
        if auth_disable:
            secret = None
        hb_int = e.float("BYTEPS_HEARTBEAT_INTERVAL", 1.0, lo=0.05)
        hb_to = e.float("BYTEPS_HEARTBEAT_TIMEOUT", 10.0, lo=0.2)
        if hb_to <= hb_int:
            raise _bad("BYTEPS_HEARTBEAT_TIMEOUT", hb_to,
                       f"must exceed BYTEPS_HEARTBEAT_INTERVAL={hb_int}")
        host_id = e.str("BYTEPS_EMULATED_HOST") or (
            f"id{worker_id}" if worker_id is not None else node_host + "/" + socket.gethostname())
        if worker_id is None and local_size == 1 and not e.str("BYTEPS_EMULATED_HOST"):
            # without DMLC_WORKER_ID, separate single-worker launches on one machine are
            # separate worker "hosts" (not one host registering local rank 0 twice)
            host_id += f"/{os.getpid()}"
        return cls(
            role=role, distributed=distributed, num_worker=num_worker,
            worker_id=worker_id, node_host=node_host,
            local_rank=local_rank, local_size=local_size,
            partition_bytes=e.int("BYTEPS_PARTITION_BYTES", 4096000, lo=1, hi=(1 << 63) - 1),
            scheduling_credit=e.int("BYTEPS_SCHEDULING_CREDIT", 4, lo=0, hi=1 << 20),
            server_engine_threads=e.int("BYTEPS_SERVER_ENGINE_THREAD", 4, lo=1, hi=256),
            enable_async=e.bool("BYTEPS_ENABLE_ASYNC"), force_distributed=force,
            async_staleness=e.int("BYTEPS_ASYNC_STALENESS", None, lo=0, hi=1 << 30),
            log_level=LOG_LEVELS[lvl],
            stall_warning_s=e.float("BYTEPS_STALL_WARNING_S", 60.0, lo=0.1),
            stall_shutdown_s=e.float("BYTEPS_STALL_SHUTDOWN_S", None, lo=0.1),
            heartbeat_interval=hb_int, heartbeat_timeout=hb_to,
            startup_timeout=e.float("BYTEPS_STARTUP_TIMEOUT", 60.0, lo=0.5),
            reinit_wait_s=e.float("BYTEPS_REINIT_WAIT_S", 2.0, lo=0.0),
            restart_count=e.int("BYTEPS_RESTART_COUNT", 0, lo=0, hi=32767),
            job_id=e.str("BYTEPS_JOB_ID", "byteps"), job_secret=secret,
            auth_disable=auth_disable,
            resend_timeout_s=e.float("BYTEPS_RESEND_TIMEOUT_S", 1.0, lo=0.01),
            max_msg_bytes=e.int("BYTEPS_MAX_MSG_BYTES", 1 << 30, lo=1 << 16),
            enable_ipc=e.bool("BYTEPS_ENABLE_IPC", True), host_id=host_id,
            enable_peers=e.bool("BYTEPS_ENABLE_PEERS", True),
            test_drop_rate=e.float("BYTEPS_TEST_DROP_RATE", 0.0, lo=0.0, hi=0.9),
            fusion_bytes=e.int("BYTEPS_FUSION_BYTES", 65536, lo=0),
            server_port=e.int("BYTEPS_SERVER_PORT", 0, lo=0, hi=65535),
            trace_on=e.bool("BYTEPS_TRACE_ON"),
            trace_dir=e.str("BYTEPS_TRACE_DIR", "./traces"),
            trace_start_step=e.int("BYTEPS_TRACE_START_STEP", 0, lo=0),
            trace_end_step=e.int("BYTEPS_TRACE_END_STEP", 1 << 30, lo=0),
            local_reduce=_local_reduce(e.str("BYTEPS_LOCAL_REDUCE", "1")),
            pcie_switch_size=e.int("BYTEPS_PCIE_SWITCH_SIZE", None, lo=1, hi=1024),
            numa_on=e.bool("BYTEPS_NUMA_ON") if e.str("BYTEPS_NUMA_ON") else None,
            shm_dir=e.str("BYTEPS_SHM_DIR", "/dev/shm"),
            min_compress_bytes=e.int("BYTEPS_MIN_COMPRESS_BYTES", 65536, lo=0),
            **kw)


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

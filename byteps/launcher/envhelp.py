"""The environment-variable part of ``bpslaunch --help``.

Defaults are read from :class:`byteps.common.config.Config`'s field defaults (the
configuration's one source of them), never copied here.
"""
from __future__ import annotations

import dataclasses
import logging

from byteps.common.config import Config

# (variable, Config field or None, default shown when the field's default says nothing, meaning)
VARIABLES = (
    ("DMLC_ROLE", "role", None, "scheduler, server or worker"),
    ("DMLC_NUM_WORKER", "num_worker", None, "worker machines (hosts); size = hosts x local size"),
    ("DMLC_NUM_SERVER", None, "required", "servers (when distributed)"),
    ("DMLC_PS_ROOT_URI", None, "required", "scheduler address (when distributed)"),
    ("DMLC_PS_ROOT_PORT", None, "required", "scheduler port (when distributed)"),
    ("DMLC_WORKER_ID", None, "registration order", "index of this worker machine"),
    ("DMLC_NODE_HOST", None, "route to scheduler", "address this node listens on"),
    ("DMLC_INTERFACE", None, "unset", "network interface whose address to use"),
    ("BYTEPS_LOCAL_SIZE", "local_size", None, "workers on this machine (bpslaunch sets it)"),
    ("BYTEPS_PARTITION_BYTES", "partition_bytes", None, "largest partition of a tensor"),
    ("BYTEPS_SCHEDULING_CREDIT", "scheduling_credit", None, "partitions in flight per worker"),
    ("BYTEPS_FUSION_BYTES", "fusion_bytes", None, "partitions up to this size are fused"),
    ("BYTEPS_SERVER_ENGINE_THREAD", "server_engine_threads", None, "summation threads/server"),
    ("BYTEPS_ENABLE_ASYNC", "enable_async", None, "asynchronous training"),
    ("BYTEPS_ENABLE_IPC", "enable_ipc", None, "colocated payloads through shared memory"),
    ("BYTEPS_LOCAL_REDUCE", "local_reduce", None, "0, 1 (= root) or slice"),
    ("BYTEPS_FORCE_DISTRIBUTED", "force_distributed", None, "use servers with one worker"),
    ("BYTEPS_LOG_LEVEL", "log_level", None, "TRACE, DEBUG, INFO, WARNING, ERROR"),
    ("BYTEPS_STARTUP_TIMEOUT", "startup_timeout", None, "seconds to wait for every node"),
    ("BYTEPS_HEARTBEAT_INTERVAL", "heartbeat_interval", None, "seconds between heartbeats"),
    ("BYTEPS_HEARTBEAT_TIMEOUT", "heartbeat_timeout", None, "silence that means dead"),
    ("BYTEPS_STALL_WARNING_S", "stall_warning_s", None, "warn when a round waits this long"),
    ("BYTEPS_STALL_SHUTDOWN_S", "stall_shutdown_s", "off", "end the job after this long"),
    ("BYTEPS_JOB_ID", "job_id", None, "job identity"),
    ("BYTEPS_JOB_SECRET", "job_secret", "--standalone makes one", "authenticates messages"),
    ("BYTEPS_RESTART_COUNT", "restart_count", None, "restarts so far (--max-restarts sets it)"),
    ("BYTEPS_TRACE_ON", "trace_on", None, "write timelines (docs/timeline.md)"),
    ("BYTEPS_TRACE_DIR", "trace_dir", None, "where timelines go"),
    ("BYTEPS_SHM_DIR", "shm_dir", None, "shared-memory folder"),
    ("BYTEPS_NUMA_ON", "numa_on", "on with >1 NUMA node", "bind workers to NUMA nodes"),
)


def default_text(field: str | None, fallback: str | None) -> str:
    """The default of a Config field as a user would write it in the environment."""
    if field is None:
        return fallback or ""
    value = {f.name: f.default for f in dataclasses.fields(Config)}[field]
    if value is None:
        return fallback or "unset"
    if field == "log_level":
        return logging.getLevelName(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if field == "local_reduce":
        return {"root": "1", "off": "0"}.get(value, value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def env_help() -> str:
    lines = ["environment (default in brackets; every variable: docs/configuration.md):"]
    for name, field, fallback, meaning in VARIABLES:
        default = f"[{default_text(field, fallback)}]"
        lines.append(f"  {name:<28}{default:<25} {meaning}")
    return "\n".join(lines)

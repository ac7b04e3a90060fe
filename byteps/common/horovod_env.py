"""Horovod's ``HOROVOD_*`` variables, read by the one config.

Those with an equivalent here set it (:func:`apply`, called by
:meth:`byteps.common.config.Config.from_env`), unless the ``BYTEPS_*``/``DMLC_*`` variable is
set explicitly: that one wins.  For the others, :func:`notes` names the equivalent, or says
there is none and why; rank 0 logs them once at ``init()``.  docs/configuration.md has the
table.

Imports only byteps.common's variables and errors (below the config).
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping, NamedTuple

from byteps.common.errors import ConfigError
from byteps.common.variables import BY_NAME, parse

__all__ = ["HONOURED", "NAMED", "apply", "log_notes_once", "notes"]


class Map(NamedTuple):
    """A Horovod variable that sets one of ours: ``convert(raw)`` is the value to set
    (None: Horovod's "off" value, nothing to set)."""

    target: str
    convert: Callable[[str], "str | None"]
    remark: str = ""


def _same(raw: str) -> str:
    return raw.strip()


def _timeline(raw: str) -> str | None:
    """BYTEPS_TIMELINE's value: the file; DYNAMIC (Horovod: start_timeline() later) sets
    nothing, as start_timeline() works here without it."""
    return None if raw.strip().upper() in ("", "DYNAMIC") else raw.strip()


def _positive(raw: str) -> str | None:
    return None if raw.strip() in ("0", "0.0") else raw.strip()


HONOURED: dict[str, Map] = {
    "HOROVOD_TIMELINE": Map("BYTEPS_TIMELINE", _timeline, "rank 0 writes Horovod's "
                            "timeline there (docs/timeline.md); DYNAMIC: call "
                            "start_timeline()"),
    "HOROVOD_TIMELINE_MARK_CYCLES": Map("BYTEPS_TIMELINE_MARK_CYCLES", _same,
                                        "a marker each time the engine takes new work"),
    "HOROVOD_FUSION_THRESHOLD": Map("BYTEPS_FUSION_BYTES", _same, "partitions up to this "
                                    "size are fused into one message; 0: no fusion"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": Map("BYTEPS_STALL_WARNING_S", _same),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": Map("BYTEPS_STALL_SHUTDOWN_S", _positive,
                                               "0 (Horovod's default): never"),
    "HOROVOD_LOG_LEVEL": Map("BYTEPS_LOG_LEVEL", lambda r: r.strip().upper()),
    "HOROVOD_AUTOTUNE": Map("BYTEPS_AUTOTUNE", _same, "tunes partition size and credit"),
    "HOROVOD_AUTOTUNE_LOG": Map("BYTEPS_AUTOTUNE_LOG", _same),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": Map("BYTEPS_AUTOTUNE_STEPS", _same,
                                             "steps measured per setting tried"),
    "HOROVOD_GLOO_TIMEOUT_SECONDS": Map("BYTEPS_COLLECTIVE_TIMEOUT_S", _same,
                                        "a rank waiting this long in one collective fails "
                                        "it on every rank"),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": Map("BYTEPS_LOCAL_REDUCE", _same,
                                          "local reduction within a host first"),
    "HOROVOD_START_TIMEOUT": Map("BYTEPS_STARTUP_TIMEOUT", _same),
    "HOROVOD_GLOO_IFACE": Map("DMLC_INTERFACE", _same),
}

_NO_CYCLE = ("none: there is no background cycle; a tensor is sent as soon as it is ready "
             "and fused with what is queued (BYTEPS_FUSION_BYTES)")
_ONE_TRANSPORT = ("none: tensors always go to CPU summation servers over ZeroMQ (tcp, "
                  "shared memory on one machine); there is no MPI, Gloo or NCCL backend to "
                  "choose")
_BAYES = ("none: autotune here measures up to 3 settings for BYTEPS_AUTOTUNE_STEPS steps "
          "each and keeps the fastest; there is no Bayesian optimisation to tune")
_LAUNCHER = "set by horovodrun; bpslaunch sets DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT"
NAMED: dict[str, str] = {
    "HOROVOD_CYCLE_TIME": _NO_CYCLE,
    "HOROVOD_CACHE_CAPACITY": "none: there is no response cache, as no coordinator "
                              "negotiates tensors: keys come from tensor names",
    "HOROVOD_STALL_CHECK_DISABLE": "none: stalled rounds are always reported; raise "
                                   "BYTEPS_STALL_WARNING_S",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "none: allgather travels through the servers; "
                                      "BYTEPS_LOCAL_REDUCE is for push_pull/allreduce",
    "HOROVOD_THREAD_AFFINITY": "BYTEPS_NUMA_ON: workers are bound to NUMA nodes, not to "
                               "listed cores",
    "HOROVOD_ELASTIC_TIMEOUT": "bpslaunch --elastic-timeout (BYTEPS_ELASTIC_TIMEOUT)",
    "HOROVOD_LOG_TIMESTAMP": "none: byteps log lines always carry the time",
    "HOROVOD_LOG_HIDE_TIME": "none: byteps log lines always carry the time",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": _LAUNCHER,
    "HOROVOD_GLOO_RENDEZVOUS_PORT": _LAUNCHER,
    "HOROVOD_CONTROLLER": _ONE_TRANSPORT,
    "HOROVOD_CPU_OPERATIONS": _ONE_TRANSPORT,
    "HOROVOD_GPU_OPERATIONS": _ONE_TRANSPORT,
    "HOROVOD_GPU_ALLREDUCE": _ONE_TRANSPORT,
    "HOROVOD_GPU_ALLGATHER": _ONE_TRANSPORT,
    "HOROVOD_GPU_BROADCAST": _ONE_TRANSPORT,
    "HOROVOD_GPU_ALLTOALL": _ONE_TRANSPORT,
    "HOROVOD_GPU_REDUCESCATTER": _ONE_TRANSPORT,
    "HOROVOD_MPI_THREADS_DISABLE": _ONE_TRANSPORT,
    "HOROVOD_NUM_NCCL_STREAMS": _ONE_TRANSPORT,
    "HOROVOD_BATCH_D2D_MEMCOPIES": "none: tensors are summed on CPU servers",
    "HOROVOD_DISABLE_GROUP_FUSION": "none: grouped operations are fused like any other "
                                    "(BYTEPS_FUSION_BYTES)",
    "HOROVOD_ENABLE_XLA_OPS": "none: the TensorFlow plugin's ops are not XLA ops",
    "HOROVOD_TORUS_ALLREDUCE": "none: tensors are summed on servers, not in rings or tori",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "none: add_process_set() and remove_process_set() work "
                                    "after init() without it",
    "HOROVOD_ELASTIC": "set by horovodrun --min-np; bpslaunch --min-workers sets "
                       "BYTEPS_MIN_WORKERS",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "none: op=Adasum here is one allgather and the same "
                                     "tree on every rank; there are no MPI chunks "
                                     "(docs/algorithms.md)",
    "HOROVOD_CCL_CACHE": _ONE_TRANSPORT,
    "HOROVOD_DISABLE_NVTX_RANGES": "none: byteps emits no NVTX ranges; its timelines are "
                                   "docs/timeline.md's",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "none: every operation completes on the engine "
                                       "thread, apart from the caller; there is no GPU "
                                       "stream to wait on",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": _BAYES,
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": _BAYES,
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": _BAYES,
}
# Outputs, not inputs: init() sets them for the worker's children, as horovodrun does.
_SET_BY_INIT = {"HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME"}


def _converted(name: str, raw: str) -> "str | None":
    """The value ``name`` sets its target to (None: nothing), validated by the target's row
    of the table; ConfigError naming the Horovod variable."""
    m = HONOURED[name]
    value = m.convert(raw)
    if value is None:
        return None
    if m.target in BY_NAME:
        try:
            parse(BY_NAME[m.target], value)
        except ConfigError as exc:
            raise ConfigError(f"{name}={raw!r} (read as {m.target}={value}) is invalid: "
                              f"{str(exc).split(' is invalid: ', 1)[-1]}") from None
    return value


def apply(env: Mapping[str, str]) -> dict:
    """``env`` with the equivalents of its ``HOROVOD_*`` variables set, where not set
    explicitly; raises ConfigError for a malformed value, naming the Horovod variable."""
    out = dict(env)
    for name in HONOURED:
        raw = env.get(name)
        if raw is None or raw == "" or env.get(HONOURED[name].target):
            continue
        value = _converted(name, raw)
        if value is not None:
            out[HONOURED[name].target] = value
    return out


def notes(env: Mapping[str, str]) -> list[str]:
    """One line per ``HOROVOD_*`` variable set in ``env``: what it became here, or its
    equivalent (or that there is none, and why)."""
    lines = []
    for name in sorted(env):
        if not name.startswith("HOROVOD_") or name in _SET_BY_INIT:
            continue
        raw = env[name]
        if name in HONOURED:
            m = HONOURED[name]
            if env.get(m.target):
                lines.append(f"{name}={raw} is ignored: {m.target}={env[m.target]} is set "
                             f"and wins")
                continue
            value = _converted(name, raw)
            what = f"{m.target}={value}" if value is not None else "nothing to set"
            lines.append(f"{name}={raw} -> {what}" + (f" ({m.remark})" if m.remark else ""))
        elif name in NAMED:
            eq = NAMED[name]
            lines.append(f"{name}={raw} has no equivalent: {eq[6:]}" if eq.startswith("none:")
                         else f"{name}={raw} has no effect here; use {eq}")
        else:
            lines.append(f"{name}={raw} has no effect: byteps does not know it "
                         f"(docs/configuration.md lists the HOROVOD_* variables it maps)")
    return lines


_LOGGED: list[bool] = []


def log_notes_once(env: Mapping[str, str], log: logging.Logger) -> None:
    """Log :func:`notes` as one block, once per process (rank 0 calls it at init)."""
    if _LOGGED:
        return
    _LOGGED.append(True)
    lines = notes(env)
    if lines:
        log.warning("HOROVOD_* variables:\n  %s", "\n  ".join(lines))

"""torchrun-style rank variables for libraries that read them (Accelerate, Lightning).

bpslaunch gives every worker ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``/``NODE_RANK`` (the worker host's index), and
horovodrun's ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``,
``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK`` and ``HOROVOD_CROSS_SIZE`` alike,
with the values BytePS itself assigns: the scheduler orders worker hosts by
``DMLC_WORKER_ID`` and then local rank, so with L workers per host
``RANK = DMLC_WORKER_ID * L + BYTEPS_LOCAL_RANK``.

bpslaunch also gives every worker ``MASTER_ADDR`` and ``MASTER_PORT``: the job's first
worker host and a port that was free there when the job started, as torchrun's
rendezvous would, so that ``torch.distributed.init_process_group("gloo")`` (with the
default ``env://``), a default ``DistributedSampler``, Accelerate and Lightning work
inside a byteps job (``MASTER_ADDR``/``MASTER_PORT`` set by the user win; with one
bpslaunch per machine, where the first worker host is not known, only those).  Under
``--slurm`` they are the allocation's first node and the port after the scheduler's.

A script started by ``torchrun`` (``WORLD_SIZE`` > 1) without any BytePS
configuration would run as WORLD_SIZE separate single-process jobs: ``init()``
warns about it once (``warn_if_torchrun_without_byteps``).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

# horovodrun's names for the same numbers (Horovod's own tests read them before init())
HOROVOD = {"RANK": "HOROVOD_RANK", "WORLD_SIZE": "HOROVOD_SIZE", "LOCAL_RANK":
           "HOROVOD_LOCAL_RANK", "LOCAL_WORLD_SIZE": "HOROVOD_LOCAL_SIZE", "GROUP_RANK":
           "HOROVOD_CROSS_RANK"}
NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
         *HOROVOD.values(), "HOROVOD_CROSS_SIZE")
MASTER = ("MASTER_ADDR", "MASTER_PORT")     # torch.distributed's env:// rendezvous
_WARNED = False


def torchrun_env(host: int | None, local_rank: int, local_size: int,
                 num_hosts: int | None) -> dict[str, str]:
    """The variables of one worker: host index ``host`` (DMLC_WORKER_ID) of ``num_hosts``
    hosts with ``local_size`` workers each.  Without a host index (the scheduler assigns
    it at registration) only the local variables are known."""
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_size)}
    if host is not None and num_hosts is not None:
        env.update(RANK=str(host * local_size + local_rank),
                   WORLD_SIZE=str(num_hosts * local_size),
                   GROUP_RANK=str(host), NODE_RANK=str(host), HOROVOD_CROSS_SIZE=str(num_hosts))
    env.update({HOROVOD[k]: env[k] for k in HOROVOD if k in env})
    return env


def apply(env: dict, host: int | None, local_rank: int, local_size: int,
          num_hosts: int | None, master: tuple[str, int] | None = None) -> dict:
    """``env`` with the torchrun variables of one worker (stale global ones removed), and
    ``MASTER_ADDR``/``MASTER_PORT`` from ``master`` (address, port) unless ``env`` sets
    both."""
    out = {k: v for k, v in env.items() if k not in NAMES}
    out.update(torchrun_env(host, local_rank, local_size, num_hosts))
    if master is not None and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        out.update(MASTER_ADDR=str(master[0]), MASTER_PORT=str(master[1]))
    return out


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env.get(name, ""))
    except ValueError:
        return None


def warn_if_torchrun_without_byteps(distributed: bool, env: Mapping[str, str]) -> bool:
    """Warn once when torchrun (or any launcher setting WORLD_SIZE > 1) started this process
    but BytePS is not configured: each process would train alone.  Returns whether it warned."""
    global _WARNED
    world = _int(env, "WORLD_SIZE")
    if _WARNED or distributed or world is None or world <= 1:
        return False
    _WARNED = True
    warnings.warn(
        f"WORLD_SIZE={world} (RANK={env.get('RANK', '?')}) says this process is one of "
        f"{world} started by torchrun or a similar launcher, but no BytePS job is configured "
        f"(no DMLC_* variables): they run as {world} separate single-process jobs and "
        f"nothing is averaged. Start the script with bpslaunch instead, e.g. "
        f"`bpslaunch -np {world} python train.py`, or set DMLC_* (docs/deployment.md)",
        RuntimeWarning, stacklevel=3)
    return True

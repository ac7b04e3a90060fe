"""``bpslaunch --slurm``: one byteps job from a Slurm allocation's ``SLURM_*`` variables.

    #SBATCH --nodes=4 --ntasks-per-node=8 --gpus-per-task=1
    export BYTEPS_JOB_SECRET=$(openssl rand -hex 32)   # srun passes it to every task
    srun bpslaunch --slurm python train.py

Every Slurm task is one worker process: host index ``SLURM_NODEID`` (=
``DMLC_WORKER_ID``), local rank ``SLURM_LOCALID`` of the node's tasks
(``SLURM_NTASKS_PER_NODE``, else ``SLURM_TASKS_PER_NODE``).  The scheduler runs
beside task 0 of the first node of ``SLURM_JOB_NODELIST``; ``--num-servers S``
servers (default: one per node) run beside local task 0 of nodes ``i mod
SLURM_NNODES``.  With one task per node, ``--local-size L`` makes that task start
L workers instead (``srun --ntasks-per-node=1 bpslaunch --slurm --local-size 8 ...``).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping

from byteps.common import torchrun
from byteps.common.config import NAMES_CHECKED, ConfigError
from byteps.launcher.supervise import Job, LaunchError, refuse, say

PORT_BASE, PORT_SPAN = 20000, 20000


class SlurmError(ValueError):
    """The SLURM_* variables do not describe a job bpslaunch can start (one line, the fix)."""


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"node list {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise SlurmError(f"node list {text!r}: unbalanced '['")
    out.append(cur)
    return [x for x in (s.strip() for s in out) if x]


def _range(spec: str, whole: str) -> list[str]:
    vals = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise SlurmError(f"node list {whole!r}: cannot read range {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise SlurmError(f"node list {whole!r}: range {part!r} goes backwards")
        width = len(lo)
        vals += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return vals


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list to names: ``node[01-03,07],gpu5`` -> node01, node02,
    node03, node07, gpu5; several brackets multiply (``r[1-2]n[1-2]`` -> r1n1, r1n2, ...)."""
    hosts: list[str] = []
    for item in _split_top(text):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices = [_range(p[1:-1], text) if p.startswith("[") else [p] for p in pieces]
        hosts += ["".join(c) for c in itertools.product(*choices)]
    if not hosts:
        raise SlurmError("SLURM_JOB_NODELIST is empty")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` ("2(x3),1") -> [2, 2, 2, 1]."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read {part!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


@dataclasses.dataclass(frozen=True)
class Placement:
    """What one Slurm task runs in the byteps job."""
    nodes: list[str]
    node_id: int                 # DMLC_WORKER_ID
    local_ranks: list[int]       # the workers this task starts
    local_size: int
    scheduler: bool
    servers: int                 # servers this task starts
    num_servers: int
    root_uri: str
    port: int
    job_id: str


def servers_on(node: int, nodes: int, num_servers: int | None = None) -> int:
    """How many of ``num_servers`` servers (default: one per node) node ``node`` of
    ``nodes`` runs: server i on node i mod ``nodes``.  The scheduler runs on node 0.
    (Also the layout of ``bpslaunch -H``, byteps.launcher.ssh.)"""
    return len(range(node, num_servers or nodes, nodes))


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SlurmError(f"{name} is not set: run bpslaunch --slurm inside an allocation "
                             f"through srun (srun bpslaunch --slurm python train.py)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise SlurmError(f"{name}={raw!r} is not an integer") from None


def place(env: Mapping[str, str], num_servers: int | None = None,
          local_size: int | None = None) -> Placement:
    """The role of this task, from the SLURM_* variables in ``env`` (raises SlurmError)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise SlurmError("SLURM_JOB_NODELIST is not set: run bpslaunch --slurm inside an "
                         "sbatch/salloc allocation through srun")
    nodes = expand_nodelist(nodelist)
    nnodes = _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", len(nodes)))
    if nnodes != len(nodes):
        raise SlurmError(f"SLURM_NNODES={nnodes} but SLURM_JOB_NODELIST={nodelist} names "
                         f"{len(nodes)} nodes")
    node_id = _int(env, "SLURM_NODEID")
    localid = _int(env, "SLURM_LOCALID")
    if not 0 <= node_id < nnodes:
        raise SlurmError(f"SLURM_NODEID={node_id} is outside 0..{nnodes - 1}")
    if env.get("SLURM_NTASKS_PER_NODE"):
        per_node = [_int(env, "SLURM_NTASKS_PER_NODE")] * nnodes
    elif env.get("SLURM_TASKS_PER_NODE"):
        per_node = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    else:
        ntasks = _int(env, "SLURM_NTASKS", nnodes)
        if ntasks % nnodes:
            raise SlurmError(f"SLURM_NTASKS={ntasks} is not a multiple of SLURM_NNODES="
                             f"{nnodes}: use srun --ntasks-per-node")
        per_node = [ntasks // nnodes] * nnodes
    if len(per_node) != nnodes or len(set(per_node)) != 1:
        raise SlurmError(f"tasks per node differ ({env.get('SLURM_TASKS_PER_NODE')}): byteps "
                         f"needs the same number on every node; use srun --ntasks-per-node")
    tasks = per_node[0]
    if not 0 <= localid < tasks:
        raise SlurmError(f"SLURM_LOCALID={localid} is outside 0..{tasks - 1}")
    if local_size and tasks != 1:
        raise SlurmError(f"--local-size {local_size} starts the workers of a node from one task, "
                         f"but Slurm runs {tasks} tasks per node (one worker each): drop "
                         f"--local-size, or use srun --ntasks-per-node=1")
    if local_size:
        local_ranks, size = list(range(local_size)), local_size
    else:
        local_ranks, size = [localid], tasks
    num_servers = num_servers or nnodes
    servers = servers_on(node_id, nnodes, num_servers) if localid == 0 else 0
    job = env.get("SLURM_JOB_ID", "0")
    step = env.get("SLURM_STEP_ID", "0")
    # the same on every task without talking to each other: from the job and step ids
    port = _int(env, "DMLC_PS_ROOT_PORT", PORT_BASE + (_int(env, "SLURM_JOB_ID", 0) * 16
                                                        + _int(env, "SLURM_STEP_ID", 0))
                % PORT_SPAN)
    return Placement(nodes=nodes, node_id=node_id, local_ranks=local_ranks, local_size=size,
                     scheduler=node_id == 0 and localid == 0, servers=servers,
                     num_servers=num_servers, root_uri=env.get("DMLC_PS_ROOT_URI") or nodes[0],
                     port=port, job_id=env.get("BYTEPS_JOB_ID") or f"slurm-{job}.{step}")


class _TaskJob(Job):
    """A Slurm task's processes: when its workers are done, its scheduler and servers
    keep serving the other nodes' workers until they end by themselves (the scheduler
    ends the job when every worker of every node has exited)."""

    def _finish(self, services):
        while any(s.p.poll() is None for s in services):
            if any(s.p.poll() not in (None, 0) and s not in self.survived for s in services):
                break
            time.sleep(0.1)
        return super()._finish(services)


def run(args, cmd: list[str]) -> int:
    """Start this task's share of the job and supervise it (bpslaunch --slurm)."""
    from byteps.launcher import _numa_cpus, _tagging, check_command, check_config
    try:
        pl = place(os.environ, args.num_servers if args.num_servers_given else None,
                   args.local_size or None)
    except SlurmError as exc:
        say(f"--slurm: {exc}")
        return 2
    if not cmd:
        say("--slurm needs a command to run: srun bpslaunch --slurm python train.py")
        return 2
    if not os.environ.get("BYTEPS_JOB_SECRET"):
        say("--slurm: BYTEPS_JOB_SECRET is not set; every task needs the same one: put "
            "`export BYTEPS_JOB_SECRET=$(openssl rand -hex 32)` in the batch script before "
            "srun (srun passes the environment to every task)")
        return 2
    base = {k: v for k, v in os.environ.items() if k not in torchrun.NAMES}
    base.update(DMLC_NUM_WORKER=str(len(pl.nodes)), DMLC_NUM_SERVER=str(pl.num_servers),
                DMLC_PS_ROOT_URI=pl.root_uri, DMLC_PS_ROOT_PORT=str(pl.port),
                BYTEPS_JOB_ID=pl.job_id)

    elastic = getattr(args, "elastic", False)
    if elastic:                 # --min-workers: every task a host of its own (elastic.py)
        from byteps.launcher.elastic import ssh_env
        total = len(pl.nodes) * pl.local_size
        try:
            base = ssh_env(args, base, total)
        except ValueError as exc:
            say(f"--slurm: {exc}")
            return 2

    # torch.distributed's env:// rendezvous: the allocation's first node, and the port after
    # the scheduler's (every task derives the same values without talking to the others)
    master = (pl.nodes[0], pl.port + 1)

    def worker_env(lr: int) -> dict:
        if elastic:
            rank = pl.node_id * pl.local_size + lr
            return dict(torchrun.apply(base, rank, 0, 1, total, master), DMLC_ROLE="worker",
                        DMLC_WORKER_ID=str(rank), BYTEPS_LOCAL_RANK="0",
                        BYTEPS_LOCAL_SIZE="1")
        return dict(torchrun.apply(base, pl.node_id, lr, pl.local_size, len(pl.nodes), master),
                    DMLC_ROLE="worker", DMLC_WORKER_ID=str(pl.node_id),
                    BYTEPS_LOCAL_RANK=str(lr), BYTEPS_LOCAL_SIZE=str(pl.local_size))
    envs = {"worker": worker_env(pl.local_ranks[0])}
    if pl.scheduler:
        envs["scheduler"] = dict(base, DMLC_ROLE="scheduler")
    if pl.servers:
        envs["server"] = dict(base, DMLC_ROLE="server")
    try:
        check_config(envs)
        check_command(cmd, base)
    except (ConfigError, LaunchError) as exc:
        return refuse(exc)
    status = tempfile.mkdtemp(prefix="bpslaunch-slurm-")
    quiet = {NAMES_CHECKED: "1", "BPSLAUNCH_STATUS_DIR": status,
             "BPSLAUNCH_SUMMARY_DIR": status}       # each worker's end-of-job line
    py = sys.executable
    job = _TaskJob(status_dir=status, in_cluster=True)
    tag = _tagging(args.tag_output, pl.local_size * len(pl.nodes))
    node = pl.nodes[pl.node_id]
    try:
        services = []
        if pl.scheduler:
            job.scheduler = job.start("scheduler", [py, "-m", "byteps.launcher._scheduler"],
                                      dict(envs["scheduler"], **quiet))
            services.append(job.scheduler)
        for i in range(pl.servers):
            services.append(job.start(f"server {i} on {node}", [py, "-m", "byteps.server"],
                                      dict(envs["server"], **quiet)))
        workers = []
        for lr in pl.local_ranks:
            rank = pl.node_id * pl.local_size + lr
            workers.append(job.start(
                f"worker rank {rank} (node {node}, local rank {lr})", cmd,
                dict(worker_env(lr), **quiet), cpus=_numa_cpus(lr, pl.local_size, base),
                tag=f"worker {rank}" if tag else None))
        if elastic:             # a lost worker is not the task's failure
            from byteps.launcher.elastic import supervise
            return supervise(job, args, workers, services, None)
        return job.supervise(workers, services)
    except LaunchError as exc:
        job.terminate(grace=1.0)
        say(str(exc))
        return exc.code
    finally:
        from byteps.launcher.report import print_summaries
        print_summaries(status, failed=bool(job.last_words))     # (removes the folder)
        shutil.rmtree(status, ignore_errors=True)
        job.say_last()

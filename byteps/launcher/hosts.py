"""The hosts of a ``bpslaunch -H`` / ``--hostfile`` job: host lists and files, the layout of
the processes over them, which of them are this machine, and the environment every
process gets from bpslaunch's.

Host names that are this machine (``localhost``, its host name, any address of it) run
their processes directly, without ssh, as Horovod does; every other host is reached over
ssh (ssh.py).  As Horovod, bpslaunch passes its whole environment to every process,
except what describes one machine or one login session (``FORWARD_EXCEPT``).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket

from byteps.common import torchrun
from byteps.launcher.slurm import servers_on

# variables that describe one process or one machine: never copied from bpslaunch's own
PER_PROCESS = ("DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NODE_HOST", "DMLC_PS_ROOT_URI",
               "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_EMULATED_HOST")
# Horovod's rule (horovod/runner/common/util/env.py: every variable but BASH_FUNC_*,
# OLDPWD and *CUDA_VISIBLE_DEVICES), plus the other variables of one machine or one login
# session: the remote login sets its own
FORWARD_EXCEPT = re.compile(
    r"BASH_FUNC_.*|OLDPWD|PWD|_|SHLVL|HOSTNAME|.*CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES"
    r"|SSH_.*|XDG_.*|DISPLAY|TMUX.*|STY|WINDOW|TERM_SESSION_ID|KRB5CCNAME|DBUS_.*")


class HostsError(ValueError):
    """-H, --hostfile or --server-hosts describe no job bpslaunch can start (one line)."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


@dataclasses.dataclass(frozen=True)
class Role:
    """One process of the job and where it runs."""
    kind: str                       # scheduler, server or worker
    index: int                      # server index or worker rank (0 for the scheduler)
    host: str
    worker_id: int | None = None    # DMLC_WORKER_ID (workers)
    local_rank: int | None = None

    @property
    def tag(self) -> str:
        return "scheduler" if self.kind == "scheduler" else f"{self.kind} {self.index}"

    @property
    def log_name(self) -> str:
        return "scheduler.log" if self.kind == "scheduler" else f"{self.kind}-{self.index}.log"


def parse_hosts(text: str, what: str = "-H") -> list[Host]:
    """``h1:4,h2:4`` (``h`` alone: 1 slot) to Hosts."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        name, _, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise HostsError(f"{what} {text}: cannot read {item!r} (HOST or HOST:SLOTS, "
                             f"example: -H gpu1:8,gpu2:8)")
        out.append(Host(name, int(slots)))
    if not out:
        raise HostsError(f"{what}: no hosts given")
    return out


def read_hostfile(path: str) -> list[Host]:
    """An MPI/horovodrun host file: ``HOST slots=N`` lines (``#`` comments; no slots: 1)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise HostsError(f"--hostfile {path}: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for w in words[1:]:
            key, _, val = w.partition("=")
            if key == "slots" and val.isdigit() and int(val) >= 1:
                slots = int(val)
            elif key != "max_slots":
                raise HostsError(f"--hostfile {path}, line {n}: cannot read {w!r} "
                                 f"(expected: HOST slots=N)")
        out.append(Host(words[0], slots))
    if not out:
        raise HostsError(f"--hostfile {path}: no hosts in it")
    return out


def plan(hosts: list[Host], server_hosts: list[str] | None = None,
         num_servers: int | None = None, scheduler_host: str | None = None) -> list[Role]:
    """Every process of the job: the scheduler, then servers, then workers by rank."""
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise HostsError(f"-H: a host is named twice ({','.join(names)}); give each host "
                         f"once with its slots (HOST:SLOTS)")
    if len({h.slots for h in hosts}) != 1:
        raise HostsError("every worker host needs the same number of slots ("
                         + ", ".join(f"{h.name}:{h.slots}" for h in hosts)
                         + "): byteps sizes a job as hosts x workers per host")
    local = hosts[0].slots
    roles = [Role("scheduler", 0, scheduler_host or names[0])]
    where = list(server_hosts) if server_hosts else names
    total = num_servers or len(where)
    for node, host in enumerate(where):
        roles += [Role("server", node + k * len(where), host)
                  for k in range(servers_on(node, len(where), total))]
    roles[1:] = sorted(roles[1:], key=lambda r: r.index)
    for h, host in enumerate(hosts):
        roles += [Role("worker", h * local + lr, host.name, h, lr) for lr in range(local)]
    return roles


def is_local(name: str) -> bool:
    """Whether host ``name`` is this machine: ``localhost``, this machine's host name (or
    its first label), or an address of it (a loopback address, or one a socket can bind
    here).  No name is looked up (no DNS wait); ``user@host`` always goes through ssh."""
    if "@" in name:
        return False
    me = socket.gethostname()
    if name in ("localhost", "localhost.localdomain", me, me.split(".")[0]):
        return True
    try:
        addr = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(addr), 0))
        return True
    except OSError:
        return False


def forwarded(environ) -> dict[str, str]:
    """The part of bpslaunch's environment every process of the job gets (Horovod's
    default: all of it but the variables of one machine, one login session or one
    process; the torchrun variables are each worker's own)."""
    own = set(PER_PROCESS) | set(torchrun.NAMES)
    return {k: v for k, v in environ.items()
            if k not in own and not FORWARD_EXCEPT.fullmatch(k)}


def exports(items: list[str], environ) -> dict[str, str]:
    """-x VAR / -x VAR=VALUE."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name.isidentifier():
            raise HostsError(f"-x {item}: expected VAR or VAR=VALUE")
        if not eq:
            if name not in environ:
                raise HostsError(f"-x {name}: not set here (give a value: -x {name}=VALUE)")
            value = environ[name]
        out[name] = value
    return out

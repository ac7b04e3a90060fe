"""``bpslaunch -H host1:4,host2:4``: a whole job on several machines through the system ``ssh``.

    bpslaunch -H gpu1:8,gpu2:8 --server-hosts cpu1,cpu2 python train.py
    bpslaunch --hostfile hosts.txt -x NCCL_DEBUG=INFO python train.py   # "gpu1 slots=8" lines

Layout (the one ``bpslaunch --slurm`` uses, ``slurm.servers_on``): worker host i
(in the order given) is ``DMLC_WORKER_ID`` i and runs its ``slots`` workers, ranks
``i * slots + local rank``; the scheduler runs on the first worker host
(``--scheduler-host`` elsewhere) and listens on the address the ssh connection
reached that host at (``--network-interface IF``: that interface's); servers run
on ``--server-hosts`` (one each, or ``--num-servers S`` round robin over them),
else colocated on the worker hosts (server i on worker host i mod hosts, default
one per host).

Every process is one ssh session running ``python -m byteps.launcher._remote``, a
small bootstrap that reads the job's variables (the secret among them) from the
session's standard input, so no command line holds the secret, and that ends its
process group when the session ends: bpslaunch's supervision (supervise.Job)
applies to the ssh clients as to local children, and nothing outlives bpslaunch on
any host.  Every host must reach the others and have this Python and byteps at the
same path (a shared file system, or the same image), and the working directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from byteps.common import torchrun
from byteps.common.config import NAMES_CHECKED, ConfigError
from byteps.launcher.slurm import servers_on
from byteps.launcher.supervise import Job, LaunchError, _child_setup, _pump, say

MARK = b"bpslaunch-remote:"
SSH_FAILED = 255           # ssh's own exit status: no connection, or it broke
STARTUP_S = 30.0           # after the connect timeout: a started session must answer by then
# variables that describe one process or one machine: never copied from bpslaunch's own
PER_PROCESS = ("DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NODE_HOST", "DMLC_PS_ROOT_URI",
               "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_EMULATED_HOST")


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


def ssh_argv(args, host: str, remote: list[str]) -> list[str]:
    """The ssh command line that runs ``remote`` (already quoted words) on ``host``."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={args.ssh_connect_timeout}",
            "-o", "LogLevel=ERROR", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if args.ssh_config:
        argv += ["-F", args.ssh_config]
    if args.ssh_port:
        argv += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        argv += ["-i", args.ssh_identity_file, "-o", "IdentitiesOnly=yes"]
    return argv + ["--", host, " ".join(remote)]


def bootstrap(python: str, *extra: str) -> list[str]:
    """The remote command: the bootstrap in bpslaunch's working directory."""
    return ["cd", shlex.quote(os.getcwd()), "&&", "exec", shlex.quote(python), "-m",
            "byteps.launcher._remote", *extra]


def _last_line(text: bytes) -> str:
    lines = [x.strip() for x in text.decode(errors="replace").splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def check_hosts(args, hosts: list[str], python: str) -> list[str]:
    """Reach every host over ssh at once (ConnectTimeout) and run the bootstrap's check
    there; one line per host that failed."""
    procs = {h: subprocess.Popen(ssh_argv(args, h, bootstrap(python, "--check")),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=_child_setup(None)) for h in hosts}
    deadline = time.monotonic() + args.ssh_connect_timeout + STARTUP_S
    errors = []
    try:
        for h, p in procs.items():
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                errors.append(f"host {h}: no answer over ssh within "
                              f"{args.ssh_connect_timeout + STARTUP_S:g} s")
                continue
            if p.returncode == SSH_FAILED:
                errors.append(f"host {h}: cannot reach it over ssh: {_last_line(err)}")
            elif p.returncode or out.strip() != b"ok":
                errors.append(f"host {h}: cannot run {python} -m byteps.launcher._remote in "
                              f"{os.getcwd()} there (the same Python and byteps must be "
                              f"at the same path on every host): {_last_line(err)}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return errors


class _Session:
    """The ssh client as supervise.Job sees it, except that ``pid`` is the remote
    process's once the bootstrap said it (Job names processes by pid)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid

    def __getattr__(self, name):
        return getattr(self.popen, name)


class RemoteProc:
    """One process of the job on another machine: an ssh client whose session runs the
    bootstrap (_remote.py).  Looks like supervise.Proc to supervise.Job: ``p`` is the
    ssh client, whose exit code is the remote process's (128 + N for a signal N; 255:
    ssh itself failed); ``kill`` sends the signal through the session."""

    def __init__(self, role: Role, argv: list[str], spec: dict):
        self.role = role
        self.what = f"{role.tag} on {role.host}"
        self.critical = True
        self.seen_exit: float | None = None
        self.pumps: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.ssh = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_child_setup(None))
        self.p = _Session(self.ssh)
        self._send((json.dumps(spec) + "\n").encode())

    def _send(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.ssh.stdin.write(data)
                self.ssh.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def handshake(self, deadline: float) -> list[str]:
        """The words of the bootstrap's first line, the last one the remote pid (raises
        LaunchError: the session did not start)."""
        words = self._first_line(deadline).decode(errors="replace").split()
        if words and words[-1].isdigit() and int(words[-1]):
            self.p.pid = int(words[-1])
        return words

    def _first_line(self, deadline: float) -> bytes:
        fd = self.ssh.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaunchError(f"{self.what}: no answer over ssh within the startup time",
                                  SSH_FAILED)
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                line = fd.readline()
                if line.startswith(MARK):
                    return line[len(MARK):].strip()
                self.ssh.wait(5)
                err = self.ssh.stderr.read()
                raise LaunchError(f"{self.what}: could not start it over ssh (exit code "
                                  f"{self.ssh.returncode}): {_last_line(line + err)}",
                                  SSH_FAILED)

    def pump(self, tag: bool, log_dir: str | None) -> None:
        """Copy the session's output to ours, lines prefixed ``[worker 3] ``; and to
        ``log_dir``/worker-3.log."""
        prefix = f"[{self.role.tag}] ".encode() if tag else b""
        log = None
        if log_dir:      # open while the pumps write to it, as long as bpslaunch runs
            log = open(os.path.join(log_dir, self.role.log_name), "ab")  # noqa: SIM115
        for src, dst in ((self.ssh.stdout, sys.stdout.buffer),
                         (self.ssh.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=_pump, args=(src, dst, prefix, log), daemon=True,
                                 name=f"bpslaunch-output-{self.role.tag}")
            t.start()
            self.pumps.append(t)

    def kill(self, sig: int) -> None:
        """Signal the remote process group through the session; SIGKILL also ends the
        session's input (the bootstrap then ends the group) and, a second later, the
        ssh client."""
        if self.ssh.poll() is not None:
            return
        sent = self._send(f"signal {int(sig)}\n".encode())
        if sig == signal.SIGKILL or not sent:
            with self._lock:
                try:
                    self.ssh.stdin.close()
                except OSError:
                    pass
            timer = threading.Timer(1.0, self._kill_client)
            timer.daemon = True
            timer.start()

    def _kill_client(self) -> None:
        if self.ssh.poll() is None:
            try:
                self.ssh.kill()
            except OSError:
                pass


def _exports(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name.isidentifier():
            raise HostsError(f"-x {item}: expected VAR or VAR=VALUE")
        if not eq:
            if name not in os.environ:
                raise HostsError(f"-x {name}: not set here (give a value: -x {name}=VALUE)")
            value = os.environ[name]
        out[name] = value
    return out


def job_env(args, hosts: list[Host], num_servers: int) -> dict[str, str]:
    """What every process gets: BYTEPS_*/DMLC_* and -x variables of bpslaunch's
    environment, the job's sizes, id and secret."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("BYTEPS_", "DMLC_")) and k not in PER_PROCESS}
    env.update(_exports(args.export or []))
    env.update(DMLC_NUM_WORKER=str(len(hosts)), DMLC_NUM_SERVER=str(num_servers),
               BYTEPS_JOB_ID=env.get("BYTEPS_JOB_ID") or f"ssh-{secrets.token_hex(4)}",
               BYTEPS_JOB_SECRET=env.get("BYTEPS_JOB_SECRET") or secrets.token_hex(32),
               BYTEPS_FORCE_DISTRIBUTED="1", **{NAMES_CHECKED: "1"})
    if args.network_interface:
        env["DMLC_INTERFACE"] = args.network_interface
    return env


def role_env(base: dict, role: Role, hosts: list[Host]) -> dict[str, str]:
    if role.kind != "worker":
        return dict(base, DMLC_ROLE=role.kind)
    if base.get("BYTEPS_MIN_WORKERS"):      # elastic: each worker a host of its own
        return dict(torchrun.apply(base, role.index, 0, 1, int(base["DMLC_NUM_WORKER"])),
                    DMLC_ROLE="worker", DMLC_WORKER_ID=str(role.index),
                    BYTEPS_LOCAL_RANK="0", BYTEPS_LOCAL_SIZE="1")
    local = hosts[0].slots
    return dict(torchrun.apply(base, role.worker_id, role.local_rank, local, len(hosts)),
                DMLC_ROLE="worker", DMLC_WORKER_ID=str(role.worker_id),
                BYTEPS_LOCAL_RANK=str(role.local_rank), BYTEPS_LOCAL_SIZE=str(local))


def _check_config(base: dict, roles: list[Role], hosts: list[Host]) -> None:
    """The checks bpslaunch makes before anything starts, with placeholders for what
    only the remote hosts know (the scheduler's address, each host's interface)."""
    from byteps.launcher import check_config
    local = {k: v for k, v in base.items() if k != "DMLC_INTERFACE"}
    local.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=local.get(
        "DMLC_PS_ROOT_PORT", "1"), **{NAMES_CHECKED: ""})
    check_config({r.kind: role_env(local, r, hosts) for r in
                  {r.kind: r for r in roles}.values()})


def run(args, cmd: list[str]) -> int:
    """Start the whole job over ssh and supervise it (bpslaunch -H / --hostfile)."""
    try:
        if args.host_list and args.hostfile:
            raise HostsError("-H and --hostfile both name the worker hosts: give one")
        hosts = parse_hosts(args.host_list) if args.host_list else read_hostfile(args.hostfile)
        server_hosts = ([h.name for h in parse_hosts(args.server_hosts, "--server-hosts")]
                        if args.server_hosts else None)
        roles = plan(hosts, server_hosts, args.num_servers if args.num_servers_given else None,
                     args.scheduler_host)
        if not cmd:
            raise HostsError("-H/--hostfile needs a command to run: bpslaunch -H h1:2,h2:2 "
                             "python train.py")
        num_servers = sum(r.kind == "server" for r in roles)
        base = job_env(args, hosts, num_servers)
        if getattr(args, "elastic", False):     # --min-workers (elastic.py)
            from byteps.launcher import elastic
            base = elastic.ssh_env(args, base, sum(h.slots for h in hosts))
        _check_config(base, roles, hosts)
    except (HostsError, ValueError) as exc:
        say(str(exc))
        return 2
    except ConfigError as exc:
        say(str(exc))
        return 2
    python = args.remote_python or sys.executable
    if shutil.which("ssh") is None:
        say("-H/--hostfile start processes through ssh, which is not installed here "
            "(apt-get install openssh-client)")
        return 127
    errors = check_hosts(args, list(dict.fromkeys(r.host for r in roles)), python)
    for text in errors:
        say(text)
    if errors:
        return SSH_FAILED
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    tag = args.tag_output is not False             # always, unless --no-tag-output
    job = Job(status_dir=None, in_cluster=False)
    job.workers = []            # Ctrl-C while starting: SIGINT to the workers started so far
    shosts = ",".join(dict.fromkeys(r.host for r in roles if r.kind == "server"))
    say(f"job {base['BYTEPS_JOB_ID']}: scheduler on {roles[0].host}, {num_servers} "
        f"server(s) on {shosts}, {len(hosts) * hosts[0].slots} worker(s) on "
        f"{','.join(h.name for h in hosts)}")
    try:
        base = start(args, job, roles, hosts, base, cmd, python, tag)
        services = [p for p in job.procs if p.role.kind != "worker"]
        if getattr(args, "elastic", False):     # workers may leave, and join from the script
            from byteps.launcher import elastic
            return elastic.supervise_ssh(job, args, services, base, hosts, cmd, python, tag)
        return job.supervise(job.workers, services)
    except LaunchError as exc:
        job.terminate(grace=1.0)
        say(str(exc))
        return exc.code
    finally:
        job.say_last()


def launch(args, job: Job, role: Role, env: dict, cmd: list[str], python: str,
           announce: bool = False) -> RemoteProc:
    """Start one process of the job over ssh (``env``: its whole environment)."""
    argv = cmd if role.kind == "worker" else [
        python, "-m", "byteps.launcher._scheduler" if role.kind == "scheduler"
        else "byteps.server"]
    spec = {"what": f"{role.tag}", "argv": argv, "env": env, "announce": announce,
            "interface": args.network_interface}
    p = RemoteProc(role, ssh_argv(args, role.host, bootstrap(python)), spec)
    job.procs.append(p)
    if role.kind == "worker":
        job.workers.append(p)
    return p


def start(args, job: Job, roles: list[Role], hosts: list[Host], base: dict, cmd: list[str],
          python: str, tag: bool) -> dict:
    """Start the scheduler (and learn its address), then the others: in waves of one
    session per host, each wave answered before the next, so that no host's sshd sees
    more than one unauthenticated connection of ours at a time (MaxStartups).  Returns
    the job's environment with the scheduler's address."""
    timeout = args.ssh_connect_timeout + STARTUP_S

    def go(role: Role, env: dict, announce: bool = False) -> RemoteProc:
        return launch(args, job, role, role_env(env, role, hosts), cmd, python, announce)

    sched = go(roles[0], base, announce=True)
    job.scheduler = sched if getattr(args, "elastic", False) else None
    answer = sched.handshake(time.monotonic() + timeout)
    if len(answer) != 4 or answer[0] != "ADDRESS":
        sched.pump(tag, args.log_dir)      # its reason follows (tagged)
        raise LaunchError(f"{sched.what}: could not start it: {' '.join(answer)}", 1)
    uri, port = answer[1], answer[2]
    sched.pump(tag, args.log_dir)
    base = dict(base, DMLC_PS_ROOT_URI=uri, DMLC_PS_ROOT_PORT=port)
    per_host: dict[str, list[Role]] = {}
    for r in roles[1:]:
        per_host.setdefault(r.host, []).append(r)
    for wave in range(max(len(v) for v in per_host.values())):
        if job.interrupted is not None:     # Ctrl-C while starting: start no more
            return base
        started = [go(rs[wave], base) for rs in per_host.values() if wave < len(rs)]
        deadline = time.monotonic() + timeout
        for p in started:
            p.handshake(deadline)
            p.pump(tag, args.log_dir)
    return base


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """bpslaunch's options of multi-host jobs over ssh."""
    g = ap.add_argument_group("several machines over ssh (docs/deployment.md)")
    g.add_argument("-H", "--host-list", metavar="H1:N,H2:N",
                   help="worker hosts and workers per host; starts the whole job over ssh")
    g.add_argument("--hostfile", metavar="FILE", help="worker hosts as 'HOST slots=N' lines")
    g.add_argument("--server-hosts", metavar="H3,H4",
                   help="hosts of the servers, one each (or -s S round robin); default: "
                        "one server on each worker host")
    g.add_argument("--scheduler-host", metavar="HOST",
                   help="where the scheduler runs (default: the first worker host)")
    g.add_argument("-x", dest="export", action="append", metavar="VAR[=VALUE]",
                   help="pass VAR (bpslaunch's value, or VALUE) to every process; "
                        "BYTEPS_*/DMLC_* always are")
    g.add_argument("--log-dir", metavar="DIR",
                   help="also write each process's output to DIR/worker-RANK.log, "
                        "server-I.log, scheduler.log")
    g.add_argument("--network-interface", metavar="IF",
                   help="every process listens on the address of interface IF of its host "
                        "(DMLC_INTERFACE); default: the address that routes to the scheduler")
    g.add_argument("--ssh-port", type=int, metavar="PORT", help="sshd's port on every host")
    g.add_argument("--ssh-identity-file", metavar="FILE", help="ssh -i FILE")
    g.add_argument("--ssh-config", metavar="FILE",
                   help="ssh -F FILE (default: ~/.ssh/config)")
    g.add_argument("--ssh-connect-timeout", type=int, default=10, metavar="S",
                   help="ssh ConnectTimeout: an unreachable host fails the launch after S "
                        "seconds (default 10)")
    g.add_argument("--remote-python", metavar="PATH",
                   help="Python on the hosts for the bootstrap, scheduler and servers "
                        "(default: the one running bpslaunch, at the same path)")

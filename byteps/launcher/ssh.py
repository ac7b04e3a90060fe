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

A host that is this machine (``-H localhost:4``, its host name or an address of it;
hosts.is_local) needs no ssh: its processes run the same bootstrap directly, as
Horovod runs local slots.  Every process gets bpslaunch's environment as Horovod
passes it (hosts.forwarded: all of it but the variables of one machine or login
session; ``-x`` adds or overrides), ``MASTER_ADDR``/``MASTER_PORT`` for torch's
``env://`` rendezvous (the first worker host and a port free there), and each worker's
end-of-job summary comes back through its session and is printed as in a standalone
job.
"""
from __future__ import annotations

import argparse
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
from byteps.launcher.hosts import (  # noqa: F401  (the names tests and elastic.py use)
    PER_PROCESS,
    Host,
    HostsError,
    Role,
    exports,
    forwarded,
    is_local,
    parse_hosts,
    plan,
    read_hostfile,
)
from byteps.launcher.supervise import Job, LaunchError, _child_setup, _pump, refuse, say

MARK = b"bpslaunch-remote:"
SUMMARY = MARK + b" SUMMARY "
SSH_FAILED = 255           # ssh's own exit status: no connection, or it broke
STARTUP_S = 30.0           # after the connect timeout: a started session must answer by then


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
            "byteps.launcher._remote", *map(shlex.quote, extra)]


def session_argv(args, host: str, python: str, *extra: str) -> list[str]:
    """The command that runs the bootstrap for ``host``: directly for this machine
    (no ssh), else through ssh."""
    if is_local(host):
        return [python, "-m", "byteps.launcher._remote", *extra]
    return ssh_argv(args, host, bootstrap(python, *extra))


def _last_line(text: bytes) -> str:
    lines = [x.strip() for x in text.decode(errors="replace").splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def rendezvous_here(args, all_local: bool) -> tuple[str, int]:
    """MASTER_ADDR and a free MASTER_PORT when the first worker host is this machine."""
    from byteps.launcher._remote import free_port, interface_address
    if args.network_interface:
        addr = interface_address(args.network_interface)
    elif all_local:
        addr = "127.0.0.1"
    else:
        import socket
        addr = socket.gethostbyname(socket.gethostname())
    return addr, free_port(addr)


def check_hosts(args, hosts: list[str], python: str,
                rendezvous: str | None = None) -> tuple[list[str], tuple[str, int] | None]:
    """Reach every remote host over ssh at once (ConnectTimeout) and run the bootstrap's
    check there; on the host ``rendezvous`` it also names its address and a free port
    (MASTER_ADDR/MASTER_PORT).  Returns one line per host that failed, and those two."""
    def check(h: str) -> list[str]:
        if h != rendezvous:
            return ["--check"]
        return ["--check", "--rendezvous", *([args.network_interface]
                                             if args.network_interface else [])]
    procs = {h: subprocess.Popen(ssh_argv(args, h, bootstrap(python, *check(h))),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=_child_setup(None)) for h in hosts}
    deadline = time.monotonic() + args.ssh_connect_timeout + STARTUP_S
    errors, found = [], None
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
            elif p.returncode or out.split()[:1] != [b"ok"]:
                errors.append(f"host {h}: cannot run {python} -m byteps.launcher._remote in "
                              f"{os.getcwd()} there (the same Python and byteps must be "
                              f"at the same path on every host): {_last_line(err)}")
            elif h == rendezvous:
                words = out.decode(errors="replace").split()
                if len(words) == 3 and words[2].isdigit():
                    found = (words[1], int(words[2]))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return errors, found


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
        self.summaries: list[dict] = []     # the worker's end-of-job summary (_remote.py)
        self._lock = threading.Lock()
        self.ssh = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_child_setup(None))
        self.p = _Session(self.ssh)
        self.spec, self.address, self.pumped = (argv, spec), None, (False, None)
        self._send((json.dumps(spec) + "\n").encode())

    def respawn(self, job: Job) -> RemoteProc:
        """A new scheduler on the address this one announced (supervise.Job restarts a
        scheduler killed by a signal; the nodes register again: scheduler/resume.py)."""
        argv, spec = self.spec
        uri, port = self.address
        p = RemoteProc(self.role, argv, dict(spec, address=uri, env=dict(
            spec["env"], DMLC_PS_ROOT_URI=uri, DMLC_PS_ROOT_PORT=port)))
        job.procs.append(p)
        p.address = self.address
        p.handshake(time.monotonic() + STARTUP_S)
        p.pump(*self.pumped)
        return p

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
        self.pumped, log = (tag, log_dir), None
        if log_dir:      # open while the pumps write to it, as long as bpslaunch runs
            log = open(os.path.join(log_dir, self.role.log_name), "ab")  # noqa: SIM115
        for src, dst, take in ((self.ssh.stdout, sys.stdout.buffer, self._take),
                               (self.ssh.stderr, sys.stderr.buffer, None)):
            t = threading.Thread(target=_pump, args=(src, dst, prefix, log, take),
                                 daemon=True, name=f"bpslaunch-output-{self.role.tag}")
            t.start()
            self.pumps.append(t)

    def _take(self, line: bytes) -> bytes:
        """Keep the bootstrap's ``SUMMARY {json}`` line (plain data, never evaluated);
        the rest of the line is output."""
        at = line.find(SUMMARY)
        if at < 0:
            return line
        try:
            doc = json.loads(line[at + len(SUMMARY):])
            if isinstance(doc, dict):
                self.summaries.append(doc)
        except ValueError:
            pass
        return line[:at]

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


def job_env(args, hosts: list[Host], num_servers: int) -> dict[str, str]:
    """What every process gets: bpslaunch's environment as Horovod passes it
    (hosts.forwarded) and the -x variables, the job's sizes, id and secret."""
    env = forwarded(os.environ)
    env.update(exports(args.export or [], os.environ))
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
        slots = sum(h.slots for h in hosts)
        if args.num_workers and args.num_workers != slots:
            raise HostsError(f"-np {args.num_workers} does not match the {slots} slot(s) of "
                             f"{args.host_list or args.hostfile}: give -np {slots}, or "
                             f"change the slots (HOST:SLOTS)")
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
        return refuse(exc)
    python = args.remote_python or sys.executable
    names = list(dict.fromkeys(r.host for r in roles))
    remote = [h for h in names if not is_local(h)]
    if remote and shutil.which("ssh") is None:
        say(f"-H/--hostfile start processes on other machines ({','.join(remote)}) "
            f"through ssh, which is not installed here (apt-get install openssh-client)")
        return 127
    first = hosts[0].name           # MASTER_ADDR/MASTER_PORT: worker rank 0's host
    try:
        errors, master = check_hosts(args, remote, python, None if is_local(first) else first)
        if is_local(first):
            master = rendezvous_here(args, not remote)
    except OSError as exc:
        errors = [f"host {first}: no address and port for MASTER_ADDR/MASTER_PORT "
                  f"(--network-interface {args.network_interface}?): {exc}"]
    for text in errors:
        say(text)
    if errors:
        return SSH_FAILED
    if master and not (base.get("MASTER_ADDR") and base.get("MASTER_PORT")):
        base.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
    # a job of this machine alone: the scheduler listens on loopback
    args.scheduler_address = None if remote or args.network_interface else "127.0.0.1"
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    tag = args.tag_output is not False             # always, unless --no-tag-output
    job = Job(status_dir=None, in_cluster=False)
    # a scheduler killed by a signal is started again on its address (supervise.py)
    job.restart_scheduler = True
    base["BPSLAUNCH_SCHEDULER_RESTART"] = "1"
    job.workers = []            # Ctrl-C while starting: SIGINT to the workers started so far
    shosts = ",".join(dict.fromkeys(r.host for r in roles if r.kind == "server"))
    here = [h for h in names if h not in remote]
    say(f"job {base['BYTEPS_JOB_ID']}: scheduler on {roles[0].host}, {num_servers} "
        f"server(s) on {shosts}, {slots} worker(s) on "
        f"{','.join(h.name for h in hosts)}"
        + (f" ({','.join(here)}: this machine, started without ssh)" if here else ""))
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
        from byteps.launcher.report import print_summary_docs, trace_note
        print_summary_docs([d for p in job.procs for d in getattr(p, "summaries", ())],
                           failed=bool(job.last_words))
        trace_note(base, ",".join(remote))
        job.say_last()


def launch(args, job: Job, role: Role, env: dict, cmd: list[str], python: str,
           announce: bool = False) -> RemoteProc:
    """Start one process of the job over ssh, or directly on this machine (``env``: its
    whole environment)."""
    argv = cmd if role.kind == "worker" else [
        python, "-m", "byteps.launcher._scheduler" if role.kind == "scheduler"
        else "byteps.server"]
    spec = {"what": f"{role.tag}", "argv": argv, "env": env, "announce": announce,
            "interface": args.network_interface,
            "address": getattr(args, "scheduler_address", None),
            "summary": role.kind == "worker"}
    p = RemoteProc(role, session_argv(args, role.host, python), spec)
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
    job.scheduler = sched
    answer = sched.handshake(time.monotonic() + timeout)
    if len(answer) != 4 or answer[0] != "ADDRESS":
        sched.pump(tag, args.log_dir)      # its reason follows (tagged)
        raise LaunchError(f"{sched.what}: could not start it: {' '.join(answer)}", 1)
    uri, port = sched.address = answer[1], answer[2]
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
                   help="worker hosts and workers per host; starts the whole job over ssh "
                        "(this machine's names, e.g. localhost:4, without ssh)")
    g.add_argument("--hostfile", "-hostfile", metavar="FILE",
                   help="worker hosts as 'HOST slots=N' lines")
    g.add_argument("--server-hosts", metavar="H3,H4",
                   help="hosts of the servers, one each (or -s S round robin); default: "
                        "one server on each worker host")
    g.add_argument("--scheduler-host", metavar="HOST",
                   help="where the scheduler runs (default: the first worker host)")
    g.add_argument("-x", dest="export", action="append", metavar="VAR[=VALUE]",
                   help="pass VAR (bpslaunch's value, or VALUE) to every process; "
                        "bpslaunch's environment already is, as Horovod passes it "
                        "(not *CUDA_VISIBLE_DEVICES, SSH_*, PWD, ...: docs/deployment.md)")
    g.add_argument("--log-dir", metavar="DIR",
                   help="also write each process's output to DIR/worker-RANK.log, "
                        "server-I.log, scheduler.log")
    g.add_argument("--network-interface", "--network-interfaces", metavar="IF",
                   help="every process listens on the address of interface IF of its host "
                        "(DMLC_INTERFACE); default: the address that routes to the scheduler")
    g.add_argument("--ssh-port", "-p", type=int, metavar="PORT",
                   help="sshd's port on every host")
    g.add_argument("--ssh-identity-file", "-i", metavar="FILE", help="ssh -i FILE")
    g.add_argument("--ssh-config", metavar="FILE",
                   help="ssh -F FILE (default: ~/.ssh/config)")
    g.add_argument("--ssh-connect-timeout", type=int, default=10, metavar="S",
                   help="ssh ConnectTimeout: an unreachable host fails the launch after S "
                        "seconds (default 10)")
    g.add_argument("--remote-python", metavar="PATH",
                   help="Python on the hosts for the bootstrap, scheduler and servers "
                        "(default: the one running bpslaunch, at the same path)")

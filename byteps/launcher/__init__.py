"""bpslaunch: start BytePS roles from DMLC_* variables, or a whole job on one machine.

    bpslaunch python train.py                         # role from DMLC_ROLE
    bpslaunch --standalone --num-workers 2 --num-servers 2 python train.py
    bpslaunch --standalone --hosts 2 --local-size 2 --num-servers 2 python train.py

Every child runs in its own process group and dies with bpslaunch
(PR_SET_PDEATHSIG).  When any process fails, the job is ended within seconds,
the first failure is reported with its role, rank, host and exit code, and
bpslaunch exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from byteps.core.config import Config, ConfigError


def _pdeathsig() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _child_setup(cpus: list[int] | None):
    """preexec_fn: die with bpslaunch; bind to the NUMA node's cores (BYTEPS_NUMA_ON)."""
    parent = os.getpid()

    def setup() -> None:
        _pdeathsig()
        if os.getppid() != parent:      # bpslaunch died before prctl took effect
            os._exit(1)
        if cpus:
            try:
                os.sched_setaffinity(0, sorted(set(cpus) & os.sched_getaffinity(0)) or cpus)
            except OSError:
                pass
    return setup


class Proc:
    def __init__(self, what: str, argv: list[str], env: dict, critical: bool,
                 cpus: list[int] | None = None):
        self.what, self.critical = what, critical
        self.p = subprocess.Popen(argv, env=env, start_new_session=True,
                                  preexec_fn=_child_setup(cpus))

    def kill(self, sig: int) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Job:
    """A set of child processes supervised together."""

    def __init__(self):
        self.procs: list[Proc] = []
        self.stopping = False
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True
        print(f"bpslaunch: received {signal.Signals(signum).name}; ending the job",
              file=sys.stderr, flush=True)
        self.terminate()
        sys.exit(128 + signum)

    def start(self, what: str, argv: list[str], env: dict, critical: bool = True,
              cpus: list[int] | None = None) -> Proc:
        p = Proc(what, argv, env, critical, cpus)
        self.procs.append(p)
        return p

    def terminate(self, grace: float = 3.0) -> None:
        for p in self.procs:
            if p.p.poll() is None:
                p.kill(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.p.poll() is None for p in self.procs):
            time.sleep(0.05)
        for p in self.procs:
            p.kill(signal.SIGKILL)       # also reaps grandchildren of the group
            try:
                p.p.wait(2)
            except subprocess.TimeoutExpired:
                pass

    def supervise(self, workers: list[Proc], services: list[Proc]) -> int:
        """Wait for the workers; end everything on the first failure."""
        while True:
            failed = [p for p in self.procs if p.p.poll() not in (None, 0)]
            # a process killed by a signal is the likely first cause: report it first
            failed.sort(key=lambda p: p.p.returncode >= 0)
            if failed:
                p, code = failed[0], failed[0].p.returncode
                first = f"{p.what} (pid {p.p.pid}) failed with {_describe_code(code)}"
                print(f"bpslaunch: {first}; ending the job", file=sys.stderr, flush=True)
                self.terminate()
                # repeated last, so that follow-on errors of other processes do not bury it
                print(f"bpslaunch: job failed; first failure: {first}", file=sys.stderr,
                      flush=True)
                return code if code > 0 else 128 - code
            if all(w.p.poll() == 0 for w in workers):
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and any(s.p.poll() is None for s in services):
                    time.sleep(0.05)
                bad = [s for s in services if s.p.poll() not in (0, None)]
                self.terminate(grace=1.0)
                for s in bad:
                    print(f"bpslaunch: {s.what} failed with {_describe_code(s.p.returncode)}",
                          file=sys.stderr, flush=True)
                return 1 if bad else 0
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_size_from_env(arg: int | None) -> int:
    if arg:
        return arg
    if os.environ.get("BYTEPS_LOCAL_SIZE"):
        return int(os.environ["BYTEPS_LOCAL_SIZE"])
    vis = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if vis and vis not in ("all", "none", "void"):
        return len([d for d in vis.split(",") if d.strip()])
    return 1


def standalone(args, cmd: list[str]) -> int:
    if args.hosts:
        hosts, local = args.hosts, args.local_size or 1
        if args.num_workers and args.num_workers != hosts * local:
            raise SystemExit(f"bpslaunch: --num-workers {args.num_workers} != --hosts {hosts} x "
                             f"--local-size {local}")
    else:
        local = args.local_size or 1
        total = args.num_workers or 1
        if total % local:
            raise SystemExit(f"bpslaunch: --num-workers {total} is not a multiple of "
                             f"--local-size {local}")
        hosts = total // local
    base = dict(os.environ)
    base.update(DMLC_NUM_WORKER=str(hosts), DMLC_NUM_SERVER=str(args.num_servers),
                DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                BYTEPS_JOB_ID=base.get("BYTEPS_JOB_ID") or f"standalone-{secrets.token_hex(4)}",
                BYTEPS_JOB_SECRET=base.get("BYTEPS_JOB_SECRET") or secrets.token_hex(16),
                BYTEPS_FORCE_DISTRIBUTED="1")
    base.pop("DMLC_NODE_HOST", None)
    summaries = tempfile.mkdtemp(prefix="bpslaunch-summary-")
    base["BPSLAUNCH_SUMMARY_DIR"] = summaries
    job = Job()
    py = sys.executable
    services = [job.start("scheduler", [py, "-m", "byteps.scheduler"],
                          dict(base, DMLC_ROLE="scheduler"))]
    for i in range(args.num_servers):
        services.append(job.start(f"server {i}", [py, "-m", "byteps.server"],
                                  dict(base, DMLC_ROLE="server")))
    workers = []
    for h in range(hosts):
        for lr in range(local):
            env = dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID=str(h),
                       BYTEPS_LOCAL_RANK=str(lr), BYTEPS_LOCAL_SIZE=str(local),
                       BYTEPS_EMULATED_HOST=f"host{h}")
            workers.append(job.start(f"worker rank {h * local + lr} (host host{h}, local rank "
                                     f"{lr})", cmd, env, cpus=_numa_cpus(lr, local, base)))
    try:
        return job.supervise(workers, services)
    finally:
        print_summaries(summaries)
        _remove_shm(base, None)


def print_summaries(folder: str) -> None:
    """Print the one-line summary each worker left in ``folder``; remove it."""
    from byteps.core.timeline import format_summary
    docs = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name)) as f:
                doc = json.load(f)
            if isinstance(doc, dict):
                docs.append(doc)
        except (OSError, ValueError):
            pass
    docs.sort(key=lambda d: d["rank"] if isinstance(d.get("rank"), int) else -1)
    for doc in docs:
        print(format_summary(doc), file=sys.stderr, flush=True)
    shutil.rmtree(folder, ignore_errors=True)


def role_mode(args, cmd: list[str]) -> int:
    role = os.environ.get("DMLC_ROLE", "worker")
    try:
        cfg = Config.from_env(role=role)
    except ConfigError as exc:
        raise SystemExit(f"bpslaunch: {exc}")
    if role == "scheduler":
        from byteps.scheduler import main
        return main(cfg)
    if role == "server":
        from byteps.server import main
        return main(cfg)
    if not cmd:
        raise SystemExit("bpslaunch: DMLC_ROLE=worker needs a command to run")
    local = local_size_from_env(args.local_size)
    job = Job()
    workers = []
    wid = os.environ.get("DMLC_WORKER_ID", "?")
    for lr in range(local):
        env = dict(os.environ, BYTEPS_LOCAL_RANK=str(lr), BYTEPS_LOCAL_SIZE=str(local))
        workers.append(job.start(f"worker (DMLC_WORKER_ID={wid}, host {cfg.node_host}, local "
                                 f"rank {lr})", cmd, env, cpus=_numa_cpus(lr, local, os.environ)))
    try:
        return job.supervise(workers, [])
    finally:
        _remove_shm(os.environ, cfg.host_id)


def _numa_cpus(local_rank: int, local_size: int, env) -> list[int] | None:
    """Cores of the NUMA node of a local rank when BYTEPS_NUMA_ON (default: >1 node)."""
    from byteps.core.local.numa import worker_cpus
    raw = (env.get("BYTEPS_NUMA_ON") or "").strip().lower()
    setting = None if not raw else raw in ("1", "true", "yes", "on")
    try:
        return worker_cpus(local_rank, local_size, setting)
    except (OSError, ValueError) as exc:
        print(f"bpslaunch: NUMA binding skipped: {exc}", file=sys.stderr, flush=True)
        return None


def _remove_shm(env, host_id: str | None) -> None:
    """Remove the job's shared-memory files (all hosts, or one host) once its processes ended."""
    from byteps.core.local.shm import host_prefix, job_prefix, remove_prefix, shm_dir
    job = env.get("BYTEPS_JOB_ID") or "byteps"
    prefix = host_prefix(job, host_id) if host_id is not None else job_prefix(job)
    gone = remove_prefix(shm_dir(env.get("BYTEPS_SHM_DIR")), prefix)
    if gone:
        print(f"bpslaunch: removed {len(gone)} shared-memory file(s) of job {job!r} left by "
              f"ended workers", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bpslaunch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--standalone", action="store_true",
                    help="start scheduler, servers and workers on this machine")
    ap.add_argument("--num-workers", "-n", type=int, default=0,
                    help="worker processes in total (standalone)")
    ap.add_argument("--num-servers", "-s", type=int, default=1, help="servers (standalone)")
    ap.add_argument("--hosts", type=int, default=0, help="emulated worker hosts (standalone)")
    ap.add_argument("--local-size", type=int, default=0, help="worker processes per host")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    args = ap.parse_args(argv)
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    for v in ("num_workers", "num_servers", "hosts", "local_size"):
        if getattr(args, v) < 0:
            ap.error(f"--{v.replace('_', '-')} must be >= 0")
    if args.standalone:
        if not cmd:
            ap.error("--standalone needs a command to run")
        if args.num_servers < 1:
            ap.error("--num-servers must be >= 1")
        return standalone(args, cmd)
    return role_mode(args, cmd)


if __name__ == "__main__":
    sys.exit(main())

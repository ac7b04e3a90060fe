"""A cluster started role by role, as on real machines, for the failure tests.

Scheduler, servers and workers are separate ``python -m byteps.launcher``
processes with DMLC_ROLE set, so a test holds every pid and can kill any
one.  Logs go to files in the test's directory.  ``close()`` SIGKILLs
whatever is left (every process of the job carries a unique BYTEPS_JOB_ID,
found by scanning /proc).
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, SCRIPTS, job_env

sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos import job_pids  # noqa: E402  (processes of a job, by BYTEPS_JOB_ID)

LAUNCH = [sys.executable, "-m", "byteps.launcher"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, tmp: Path, workers: int = 2, servers: int = 1, args: tuple = (),
                 script: str = "fail_train.py", worker_env: dict | None = None, **env):
        self.dir = Path(tmp)
        self.nworkers, self.nservers = workers, servers
        self.port = free_port()
        self.server_ports = [free_port() for _ in range(servers)]
        self.job = f"failjob-{secrets.token_hex(6)}"
        self.secret = secrets.token_hex(16)
        self.base = job_env(**{**dict(
            DMLC_NUM_WORKER=workers, DMLC_NUM_SERVER=servers, DMLC_PS_ROOT_URI="127.0.0.1",
            DMLC_PS_ROOT_PORT=self.port, BYTEPS_JOB_ID=self.job, BYTEPS_JOB_SECRET=self.secret,
            BYTEPS_HEARTBEAT_INTERVAL=0.5, BYTEPS_HEARTBEAT_TIMEOUT=4, BYTEPS_STARTUP_TIMEOUT=60,
            BYTEPS_PARTITION_BYTES=4096, BYTEPS_LOG_LEVEL="INFO"), **env})
        self.worker_env = worker_env or {}
        self.argv = [sys.executable, str(SCRIPTS / script), str(self.dir), *map(str, args)]
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_at: dict[str, float] = {}

    # ------------------------------------------------------------- start
    def spawn(self, name: str, env: dict, argv: list[str] = ()) -> subprocess.Popen:
        log = open(self.dir / f"log.{name}", "w")
        p = subprocess.Popen(LAUNCH + list(argv), env=env, cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def start(self, hold=()) -> "Cluster":
        """Start every process except those named in ``hold`` (see :meth:`start_held`)."""
        self.held = {}
        self.held["scheduler"] = (dict(self.base, DMLC_ROLE="scheduler"), [])
        for i, port in enumerate(self.server_ports):
            self.held[f"server{i}"] = (dict(self.base, DMLC_ROLE="server",
                                            BYTEPS_SERVER_PORT=str(port)), [])
        for w in range(self.nworkers):
            env = dict(self.base, DMLC_ROLE="worker", DMLC_WORKER_ID=str(w))
            env.update({k: str(v) for k, v in self.worker_env.get(w, {}).items()})
            self.held[f"worker{w}"] = (env, self.argv)
        for name in [n for n in self.held if n not in hold]:
            self.spawn(name, *self.held.pop(name))
        return self

    def start_held(self) -> None:
        for name in list(self.held):
            self.spawn(name, *self.held.pop(name))

    # ------------------------------------------------------------- observe
    def wait_files(self, pattern: str, count: int, timeout: float = 60) -> list[Path]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(self.dir.glob(pattern))
            if len(found) >= count:
                return found
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise AssertionError(f"processes ended early {dead}\n{self.logs()}")
            time.sleep(0.1)
        raise AssertionError(f"no {count} x {pattern} after {timeout} s\n{self.logs()}")

    def worker_pid(self, rank: int) -> int:
        return int((self.dir / f"pid.rank{rank}").read_text())

    def wait(self, timeout: float, names=None) -> dict[str, int]:
        """Wait for the named processes (default all) to exit; record when each did."""
        names = list(names or self.procs)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in names:
                if n not in self.exit_at and self.procs[n].poll() is not None:
                    self.exit_at[n] = time.monotonic()
            if all(n in self.exit_at for n in names):
                break
            time.sleep(0.05)
        return {n: self.procs[n].poll() for n in names}

    def log(self, name: str) -> str:
        p = self.dir / f"log.{name}"
        return p.read_text(errors="replace") if p.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"===== {n} (rc {p.poll()})\n{self.log(n)[-3000:]}"
                         for n, p in self.procs.items())

    def job_pids(self) -> list[int]:
        """Live (non-zombie) processes whose environment carries this job's id."""
        return job_pids(self.job)

    def listening(self) -> dict[int, str]:
        """{port: local ip} of the job's ports that are in LISTEN state."""
        return listening_ports([self.port] + self.server_ports)

    def rss_mb(self, pid: int) -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError(f"no VmRSS for pid {pid}")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in self.job_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def listening_ports(ports) -> dict[int, str]:
    want, out = set(ports), {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            ip_hex, port_hex = f[1].split(":")
            if f[3] == "0A" and int(port_hex, 16) in want:
                out[int(port_hex, 16)] = _ip(ip_hex)
    return out


def _ip(h: str) -> str:
    if len(h) == 8:
        return socket.inet_ntoa(bytes.fromhex(h)[::-1])
    return h

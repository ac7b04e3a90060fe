"""Command lines of the jobs the cluster benchmark runs, and running them.

Every process runs on an emulated host with ``ip netns exec <ns> env -i
VAR=... cmd`` — the byteps roles exactly like on a real cluster: one
``python -m byteps.launcher`` per role per host, configured by ``DMLC_*``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cluster.netns import Host, Plan

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULT_TAG = "CLUSTER_RESULT "


@dataclasses.dataclass
class Spec:
    """One process of a job: what it is, where it runs, its argv and env."""
    what: str
    host: Host
    argv: list[str]
    env: dict[str, str]
    critical: bool = True       # the job is done when every critical process exited 0

    def __post_init__(self):
        self.env = {k: str(v) for k, v in self.env.items()}

    def command(self, plan: Plan) -> list[str]:
        return plan.exec_prefix(self.host, self.env) + self.argv


@dataclasses.dataclass
class Outcome:
    what: str
    returncode: int | None
    stdout: str
    stderr: str
    cpu_s: float | None = None     # CPU seconds of the process and the children it waited for


class JobError(RuntimeError):
    """A job on the emulated cluster failed or timed out."""


def base_env(**extra) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "LANG": "C.UTF-8"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def byteps_job(workers: list[Host], servers: list[Host], scheduler: Host, cmd: list[str],
               port: int, extra_env: dict | None = None) -> list[Spec]:
    """Scheduler + one server per entry of ``servers`` + one worker launcher per host."""
    if not workers or not servers:
        raise ValueError("a byteps job needs at least one worker host and one server host")
    py = sys.executable
    common = base_env(DMLC_NUM_WORKER=len(workers), DMLC_NUM_SERVER=len(servers),
                      DMLC_PS_ROOT_URI=scheduler.ip, DMLC_PS_ROOT_PORT=port,
                      BYTEPS_JOB_ID=f"cluster-{secrets.token_hex(3)}",
                      BYTEPS_JOB_SECRET=secrets.token_hex(16), **(extra_env or {}))
    specs = [Spec("scheduler", scheduler, [py, "-m", "byteps.launcher"],
                  dict(common, DMLC_ROLE="scheduler", DMLC_NODE_HOST=scheduler.ip), False)]
    for i, h in enumerate(servers):
        specs.append(Spec(f"server {i} ({h.ip})", h, [py, "-m", "byteps.launcher"],
                          dict(common, DMLC_ROLE="server", DMLC_NODE_HOST=h.ip), False))
    for i, h in enumerate(workers):
        specs.append(Spec(f"worker {i} ({h.ip})", h, [py, "-m", "byteps.launcher", *cmd],
                          dict(common, DMLC_ROLE="worker", DMLC_WORKER_ID=i,
                               DMLC_NODE_HOST=h.ip)))
    return specs


def gloo_job(hosts: list[Host], cmd: list[str], port: int,
             extra_env: dict | None = None) -> list[Spec]:
    """One torch.distributed process per host; rank 0's host is the rendezvous."""
    return [Spec(f"gloo rank {r} ({h.ip})", h, list(cmd),
                 base_env(RANK=r, WORLD_SIZE=len(hosts), LOCAL_RANK=0, LOCAL_WORLD_SIZE=1,
                          MASTER_ADDR=hosts[0].ip, MASTER_PORT=port,
                          GLOO_SOCKET_IFNAME=h.dev, **(extra_env or {})))
            for r, h in enumerate(hosts)]


def probe_job(pairs: list[tuple[Host, Host]], port: int, seconds: float) -> list[Spec]:
    """Raw TCP, full duplex, on every (a, b) pair at once."""
    py, probe = sys.executable, str(HERE / "tcp_probe.py")
    specs = []
    for i, (a, b) in enumerate(pairs):
        specs.append(Spec(f"tcp serve {b.ip}", b, [py, probe, "serve", str(port + i),
                                                   str(seconds)], base_env()))
        specs.append(Spec(f"tcp send {a.ip}", a, [py, probe, "send", b.ip, str(port + i),
                                                  str(seconds)], base_env()))
    return specs


def mesh_job(workers: list[Host], servers: list[Host], port: int, seconds: float) -> list[Spec]:
    """Raw TCP, full duplex, from every worker host to every server host at once (the PS
    pattern: benchmarks/cluster/tcp_mesh.py)."""
    py, mesh = sys.executable, str(HERE / "tcp_mesh.py")
    specs = [Spec(f"mesh serve {s.ip}", s, [py, mesh, "serve", str(port), str(len(workers)),
                                            str(seconds)], base_env()) for s in servers]
    return specs + [Spec(f"mesh connect {w.ip}", w, [py, mesh, "connect", str(seconds)]
                         + [f"{s.ip}:{port}" for s in servers], base_env()) for w in workers]


def parse_results(text: str) -> list[dict]:
    """The ``CLUSTER_RESULT {json}`` records in a process's output (others ignored)."""
    out = []
    for line in text.splitlines():
        if line.startswith(RESULT_TAG):
            try:
                doc = json.loads(line[len(RESULT_TAG):])
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
    return out


def _kill(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(p: subprocess.Popen, cpu: dict, block: bool = False) -> int | None:
    """``p.poll()`` (or ``p.wait()``), recording the CPU seconds (user + system) of the
    process and of every descendant it waited for (os.wait4)."""
    if p.returncode is not None:
        return p.returncode
    try:
        pid, status, ru = os.wait4(p.pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return p.poll()
    if pid == 0:
        return None
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu[p.pid] = ru.ru_utime + ru.ru_stime
    return p.returncode


_STOP = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _spawn(argv: list[str], fo, fe) -> subprocess.Popen:
    """Popen with Ctrl-C/SIGTERM held off until the child is recorded (an interrupt inside
    Popen would leave a process nobody kills); the child starts with the old mask."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
    try:
        return subprocess.Popen(argv, stdout=fo, stderr=fe, start_new_session=True, cwd=ROOT,
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK,
                                                                          old))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_specs(plan: Plan, specs: list[Spec], timeout: float,
              grace_s: float = 10.0) -> list[Outcome]:
    """Start every process, wait for the critical ones, end the rest; raise on failure."""
    procs, files = [], []
    cpu: dict[int, float] = {}
    try:
        for s in specs:
            fo = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed below, after the job)
            fe = tempfile.TemporaryFile("w+")  # noqa: SIM115
            files.append((fo, fe))
            procs.append(_spawn(s.command(plan), fo, fe))
        deadline = time.monotonic() + timeout
        failed = None
        while time.monotonic() < deadline:
            codes = [_reap(p, cpu) for p in procs]
            bad = [(s, c) for s, c in zip(specs, codes) if c not in (None, 0)]
            if bad:
                failed = f"{bad[0][0].what} exited with code {bad[0][1]}"
                break
            if all(c == 0 for s, c in zip(specs, codes) if s.critical):
                break
            time.sleep(0.05)
        else:
            failed = f"timed out after {timeout:g} s"
        # services get a moment to finish on their own after the workers are done
        grace = time.monotonic() + (0 if failed else grace_s)
        while time.monotonic() < grace and any(_reap(p, cpu) is None for p in procs):
            time.sleep(0.05)
    finally:
        for p in procs:
            if _reap(p, cpu) is None:
                _kill(p, signal.SIGTERM)
        t = time.monotonic() + 3
        while time.monotonic() < t and any(_reap(p, cpu) is None for p in procs):
            time.sleep(0.05)
        for p in procs:
            _kill(p, signal.SIGKILL)
            t = time.monotonic() + 5
            while time.monotonic() < t and _reap(p, cpu) is None:
                time.sleep(0.05)
    outcomes = []
    for s, p, (fo, fe) in zip(specs, procs, files):
        fo.seek(0)
        fe.seek(0)
        outcomes.append(Outcome(s.what, p.returncode, fo.read(), fe.read(), cpu.get(p.pid)))
        fo.close()
        fe.close()
    if failed:
        detail = "\n".join(f"--- {o.what} (rc {o.returncode}):\n{o.stderr[-1500:]}"
                           f"{o.stdout[-500:]}" for o in outcomes)
        raise JobError(f"{failed}\n{detail}")
    return outcomes


def collect(outcomes: list[Outcome]) -> list[dict]:
    """All result records of a job, in process order."""
    return [r for o in outcomes for r in parse_results(o.stdout)]

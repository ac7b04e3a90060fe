"""Shared fixtures: run a real multi-process job with a hard timeout."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
BPSLAUNCH = [sys.executable, "-m", "byteps.launcher"]
_CLI = Path(sys.executable).parent / "bpslaunch"
#: the ``bpslaunch`` command users type (the installed console script, else the module)
BPSLAUNCH_CLI = [str(_CLI)] if _CLI.exists() else BPSLAUNCH
#: Horovod's vendored suites run inside jobs (tests/horovod/run.py, tests/test_horovod_suites.py)
collect_ignore = ["horovod"]


def job_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "BYTEPS_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def on_terminal(argv: list[str], env: dict, timeout: float = 60) -> str:
    """Run ``argv`` with a pseudo-terminal as its stdout and stderr (as from a user's
    shell) for at most ``timeout`` s; asserts it exited 0 and returns what it wrote."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:          # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                out += data
            elif p.poll() is not None:
                break
        assert p.wait(10) == 0, out.decode(errors="replace")
    finally:
        p.kill()
        os.close(master)
    return out.decode(errors="replace")


def run_job(argv: list[str], workers: int = 2, servers: int = 1, timeout: float = 120,
            launcher_args: tuple = (), **env) -> subprocess.CompletedProcess:
    """``bpslaunch --standalone`` a command; fails the test (never hangs) on timeout.
    ``workers`` workers are as many emulated hosts (``--hosts``) unless ``launcher_args``
    lay them out (``--hosts``/``--local-size``, or elastic ``--min-workers``)."""
    own = {"--hosts", "--local-size", "--min-workers"} & set(launcher_args)
    layout = () if own else ("--hosts", str(workers))
    cmd = BPSLAUNCH + ["--standalone", "--num-workers", str(workers), *layout,
                       "--num-servers", str(servers), *launcher_args, *argv]
    p = subprocess.Popen(cmd, env=job_env(**env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _end(p)
        stalls = "\n".join(t for t in err.splitlines() if "stall" in t)[-4000:]
        pytest.fail(f"job timed out after {timeout} s: {cmd}\nstall reports:\n{stalls}\n"
                    f"stdout (tail):\n{out[-4000:]}\nstderr (tail):\n{err[-16000:]}")
    except BaseException:       # pytest's own timeout, Ctrl-C: the job must not outlive it
        _end(p)
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _end(p: subprocess.Popen) -> tuple[str, str]:
    """End a timed-out bpslaunch and its job (its processes run in sessions of their own,
    so killing bpslaunch alone would leave them running beside the next tests): SIGTERM
    ends the job gracefully, a second signal kills every process of it
    (byteps/launcher/signals.py); returns what the job printed."""
    for sig, wait in ((signal.SIGTERM, 6), (signal.SIGTERM, 3)):
        p.send_signal(sig)
        try:
            return p.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    p.kill()
    return p.communicate()


def run_script(name: str, *args, **kw) -> subprocess.CompletedProcess:
    """Run tests/scripts/<name> under bpslaunch --standalone."""
    return run_job([sys.executable, str(SCRIPTS / name), *map(str, args)], **kw)


def assert_ok(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, f"rc={res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"


def read_results(out_dir: Path) -> dict[int, dict]:
    """Each worker script writes out_dir/rank<r>.json; return them by rank."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out_dir.glob("rank*.json")}


@pytest.fixture
def ps_job():
    return run_script


@pytest.fixture(scope="session", autouse=True)
def _no_shm_leftovers():
    """Tests that SIGKILL servers leave shared-memory files behind (as any killed process
    would); remove what the test session created so a CI machine's /dev/shm stays clean."""
    shm = Path("/dev/shm")
    before = set(os.listdir(shm)) if shm.is_dir() else set()
    yield
    if shm.is_dir():
        # list first, then look for users: a file created after the listing is never
        # touched, and a temporary file (``.tmpPID``, about to be published) never
        left = set(os.listdir(shm)) - before
        busy = _mapped_shm()          # another session's job still uses them: leave them
        for name in left - busy:
            if name.startswith("bps-") and ".tmp" not in name:
                try:
                    (shm / name).unlink()
                except OSError:
                    pass


def _mapped_shm() -> set:
    """Names of /dev/shm files some live process has mapped or open (a job of another test
    session running at the same time)."""
    names = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                names.update(line.rsplit("/", 1)[1].strip() for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    names.add(target[len("/dev/shm/"):])
        except OSError:
            continue
    return names


@pytest.fixture
def small_tmpfs(tmp_path):
    """``small_tmpfs(mb)`` mounts a tmpfs of ``mb`` MiB (like Docker's small /dev/shm) and
    returns its path; skipped when not root; unmounted after the test."""
    mounted = []

    def mount(mb: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root (mount -t tmpfs)")
        d = tmp_path / f"tmpfs{len(mounted)}"
        d.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(d)],
                             capture_output=True, text=True, timeout=30, check=False)
        if res.returncode:
            pytest.skip(f"cannot mount a tmpfs (no CAP_SYS_ADMIN?): {res.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30, check=False)

"""The classes behind byteps.ray's actors (made remote by the executor).

``ServiceActor`` runs byteps' own scheduler or server as a child process (in its own
process group, killed with the actor through PR_SET_PDEATHSIG); ``WorkerActor`` runs
``train_fn`` in the actor's process with the ``DMLC_*``/``BYTEPS_*`` variables of one
worker.  Both are single-threaded actors: children are started from the actor's one
thread, which PR_SET_PDEATHSIG needs (the signal follows the thread that forked), set by
byteps.ray._child.
"""
from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

TAIL_LINES = 20


def node_host() -> dict:
    """This actor's node: its address as Ray knows it, and its host name."""
    try:
        import ray
        ip = ray.util.get_node_ip_address()
    except Exception:            # noqa: BLE001 - outside Ray (unit tests)
        ip = "127.0.0.1"
    return {"ip": ip, "name": socket.gethostname(), "pid": os.getpid()}


def describe(host: dict) -> str:
    return host["ip"] if host["name"] in ("", host["ip"]) else f"{host['name']}, {host['ip']}"


class ServiceActor:
    """One byteps scheduler or server process on a Ray node."""

    def __init__(self, label: str):
        self.label = label
        self.proc: subprocess.Popen | None = None
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.pump: threading.Thread | None = None

    def host(self) -> dict:
        return node_host()

    def free_port(self) -> int:
        """A TCP port free on this node (for the scheduler: DMLC_PS_ROOT_PORT)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, module: str, env: dict) -> int:
        """Start ``python -m module`` with the actor's environment (less its own
        ``BYTEPS_*``/``DMLC_*``) and ``env`` (the job secret travels in the environment,
        never on the command line); returns its pid."""
        from byteps.common.torchrun import NAMES
        from byteps.ray._child import PARENT_VAR
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("BYTEPS_", "DMLC_")) and k not in NAMES}
        full.update(env)
        full[PARENT_VAR] = str(os.getpid())
        self.stop()
        self.tail.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "byteps.ray._child", module], env=full,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.pump = threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True)
        self.pump.start()
        return self.proc.pid

    def _pump(self, pipe) -> None:
        prefix = f"[{self.label}] "
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            print(prefix + line, file=sys.stderr, flush=True)
        pipe.close()

    def poll(self) -> tuple:
        """(exit code or None while it runs, its last output lines)."""
        if self.proc is None:
            return None, ""
        rc = self.proc.poll()
        if rc is not None and self.pump is not None:
            self.pump.join(timeout=2.0)
        return rc, "\n".join(self.tail)

    def stop(self, grace: float = 3.0) -> int | None:
        """End the process group (SIGTERM, SIGKILL ``grace`` s later); its exit code."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        if p.poll() is None:
            _signal_group(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(p.pid, signal.SIGKILL)     # anything left in the group
        p.wait()
        return p.returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerActor:
    """One byteps worker (local size 1): runs ``train_fn`` with its variables."""

    def __init__(self, index: int):
        self.index = index

    def host(self) -> dict:
        return node_host()

    def execute(self, env: dict, fn, args: tuple, kwargs: dict) -> tuple:
        """Run ``fn(*args, **kwargs)`` with ``env`` added to os.environ; leave the byteps
        job afterwards.  Returns ("ok", result) or ("error", cause, traceback text): the
        user's exception need not unpickle on the driver."""
        from byteps.common.util import env as scoped_env
        started = time.monotonic()
        with scoped_env(**env):
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:   # noqa: BLE001 - reported to the driver, with rank
                return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                        time.monotonic() - started)
        try:
            _leave_job()
        except BaseException as exc:   # noqa: BLE001
            cause = f"leaving the job after train_fn returned: {type(exc).__name__}: {exc}"
            return ("error", cause, traceback.format_exc(), time.monotonic() - started)
        return ("ok", result)


def _leave_job() -> None:
    """bps.shutdown() if train_fn left byteps initialized (the actor's process lives on,
    so no exit hook would tell the scheduler)."""
    api = sys.modules.get("byteps.core.api")
    if api is not None and api.is_initialized():
        api.shutdown()

"""``byteps.run(func, args=(), kwargs=None, np=1, ...)``: Horovod's ``horovod.run``.

Runs ``func(*args, **kwargs)`` on ``np`` workers of a new job on this machine (a
scheduler and ``num_servers`` servers are started with them, as ``bpslaunch -np``
does) and returns the workers' return values, ordered by rank::

    import byteps

    def train(lr):
        import byteps.torch as bps
        bps.init()
        ...
        return bps.rank(), loss

    results = byteps.run(train, args=(0.1,), np=4)

``func`` calls ``init()`` itself, as under Horovod.  A failed worker ends the job and
``run`` raises ``RuntimeError`` (the job's output names the cause).  The function and
its arguments reach the workers, and their results come back, as pickles in a private
temporary folder (mode 0700) on this machine, never through a socket; cloudpickle is
used when installed (functions defined in ``__main__``, lambdas, closures), otherwise
pickle, with the caller's main module imported in each worker as ``multiprocessing``'s
spawn does.  Jobs across machines are ``bpslaunch -H``'s (docs/deployment.md):
``hosts``/``hostfile`` may only name this machine.

Horovod's other arguments: ``min_np``/``max_np`` make the job elastic
(``--min-workers``/``--max-workers``), ``output_filename`` is ``--log-dir``,
``start_timeout`` is ``BYTEPS_STARTUP_TIMEOUT``, ``network_interface`` is
``--network-interface``; ``slots``, ``reset_limit``, ``disable_cache``, ``verbose``,
``use_gloo``, ``use_mpi``, ``mpi_args`` and the ssh settings have nothing to choose here
(byteps has one transport, and the job is local) and are ignored.

    python -m byteps.launcher.pyrun DIR      # what each worker runs
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

__all__ = ["run"]

_LOCAL = {"localhost", "127.0.0.1", "::1"}


def _pickler():
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        import pickle
        return pickle


def _check_local(hosts: str | None, hostfile: str | None) -> None:
    names = []
    if hosts:
        names += [h.split(":")[0].strip() for h in str(hosts).split(",") if h.strip()]
    if hostfile:
        with open(hostfile) as f:
            names += [line.split()[0].split(":")[0] for line in f
                      if line.strip() and not line.lstrip().startswith("#")]
    own = _LOCAL | {socket.gethostname(), socket.getfqdn()}
    far = sorted({n for n in names if n not in own})
    if far:
        raise ValueError(f"byteps.run starts the job on this machine; hosts {far} are not "
                         f"this one. Across machines, launch the script with bpslaunch -H "
                         f"host1:N,host2:N python train.py (docs/deployment.md)")


def run(func, args=(), kwargs=None, np=1, min_np=None, max_np=None, slots=None,
        reset_limit=None, hosts=None, hostfile=None, start_timeout=None, ssh_port=None,
        ssh_identity_file=None, disable_cache=None, output_filename=None, verbose=None,
        use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None, executable=None,
        num_servers=1) -> list:
    """Run ``func(*args, **kwargs)`` on ``np`` workers of a new job on this machine and
    return their results ordered by rank (Horovod's ``horovod.run``; module docstring)."""
    if not callable(func):
        raise TypeError(f"byteps.run(func, ...): func must be callable, got "
                        f"{type(func).__name__}")
    for name, value in (("np", np), ("num_servers", num_servers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"byteps.run({name}={value!r}): must be an integer >= 1")
    _check_local(hosts, hostfile)
    pk = _pickler()
    folder = tempfile.mkdtemp(prefix="byteps-run-")          # mode 0700
    try:
        with open(os.path.join(folder, "call.pkl"), "wb") as f:
            pk.dump((func, tuple(args or ()), dict(kwargs or {})), f)
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"main": os.path.abspath(main) if main else None, "pickler": pk.__name__,
                       "sys_path": [p for p in sys.path if isinstance(p, str)]}, f)
        py = executable or sys.executable
        cmd = [sys.executable, "-m", "byteps.launcher", "-np", str(np), "-s", str(num_servers)]
        for flag, value in (("--min-workers", min_np), ("--max-workers", max_np),
                            ("--log-dir", output_filename),
                            ("--network-interface", network_interface)):
            if value is not None:
                cmd += [flag, str(value)]
        env = dict(os.environ)
        if start_timeout is not None:
            env["BYTEPS_STARTUP_TIMEOUT"] = str(start_timeout)
        rc = subprocess.call(cmd + [py, "-m", "byteps.launcher.pyrun", folder], env=env)
        if rc != 0:
            raise RuntimeError(f"byteps.run: the job of {np} worker(s) failed (exit code "
                               f"{rc}); its output above names the cause")
        results = {}
        for name in os.listdir(folder):
            if name.startswith("result.") and name.endswith(".pkl"):
                with open(os.path.join(folder, name), "rb") as f:
                    results[int(name.split(".")[1])] = pk.load(f)
        return [results[r] for r in sorted(results)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rank() -> int:
    """This worker's rank in its last job (after ``shutdown()`` too; read from the core
    when ``func`` loaded it, never imported from here), else its place on this machine."""
    state = sys.modules.get("byteps.core.state")
    ids = state.last_ids() if state is not None else None
    if ids is not None:
        return ids[0]
    from byteps.common import variables
    host = variables.value("DMLC_WORKER_ID") or 0
    return host * variables.value("BYTEPS_LOCAL_SIZE") + variables.value("BYTEPS_LOCAL_RANK")


def _worker(folder: str) -> None:
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    pk = _pickler() if meta.get("pickler") == "cloudpickle" else __import__("pickle")
    if meta.get("main") and pk.__name__ == "pickle":   # __main__.func resolves in the
        import multiprocessing.spawn                      # caller's main module
        multiprocessing.spawn.prepare({"init_main_from_path": meta["main"],
                                       "sys_path": meta.get("sys_path") or sys.path})
    with open(os.path.join(folder, "call.pkl"), "rb") as f:
        func, args, kwargs = pk.load(f)
    result = func(*args, **kwargs)
    path = os.path.join(folder, f"result.{_rank()}.pkl")
    with open(path + ".tmp", "wb") as f:
        pk.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    _worker(sys.argv[1])

"""bpslaunch's children: start them, tag their output, supervise them, name the root cause.

Every child runs in its own process group and dies with bpslaunch
(PR_SET_PDEATHSIG).  A child that ends with ``PEER_FAILED_EXIT`` was told that
another process of the job failed; the *root cause* is the first child that
failed for its own reason (an exit code other than 0 and ``PEER_FAILED_EXIT``,
or a signal), reported last together with the reason the scheduler gave.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from byteps.common import variables
from byteps.common.errors import PEER_FAILED_EXIT
from byteps.launcher import signals

# After the first process ended because of a failure elsewhere, wait this long for the
# process that failed for its own reason (still tearing down) before ending the job.
ROOT_CAUSE_WAIT_S = 10.0
# SIGINT (Ctrl-C) to bpslaunch: the workers get SIGINT (KeyboardInterrupt) and this long to
# end by themselves (bpslaunch --grace-period); then SIGTERM, and SIGKILL TERM_GRACE_S later
GRACE_PERIOD_S = 10.0
TERM_GRACE_S = 3.0
# A failed job: once the scheduler has told everyone (its reason is left after its
# broadcast), the workers get this long to end by themselves, with their own error line
# and their `except`/`finally` blocks, before SIGTERM
WORKER_EXIT_WAIT_S = 2.0
# a standalone job's scheduler killed by a signal is started again at most this often
MAX_SCHEDULER_RESTARTS = 10
_OUT_LOCK = threading.Lock()
# called with _OUT_LOCK held before anything is written (the live view erases its lines)
OUTPUT_HOOKS: list = []


def _before_output() -> None:
    for hook in OUTPUT_HOOKS:
        hook()


def _wait_until(done, limit: float) -> None:
    """Poll ``done()`` every 50 ms for at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


class LaunchError(Exception):
    """A child could not be started (a missing or non-executable program)."""

    def __init__(self, text: str, code: int = 127):
        super().__init__(text)
        self.code = code        # bpslaunch's exit code, as a shell's (127: not found)


def _libc_prctl():
    """libc's ``prctl``, looked up when bpslaunch imports this module, before any fork: a
    ``preexec_fn`` runs in a child forked from a process with threads (the output pumps,
    the escalation thread, an import in the background), where ``import`` or ``dlopen``
    can wait forever on a lock that another thread held at the fork.  With ``import
    ctypes`` and ``dlopen`` in the child, a scheduler started again after a kill 0.3 s
    into the job (bpslaunch importing numpy in a thread meanwhile) never ran, and
    bpslaunch waited in ``Popen`` for it (tests/test_chaos.py, seed 1, fault 3)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG, _SIGKILL = 1, int(signal.SIGKILL)


def _pdeathsig() -> None:
    """Be killed (SIGKILL) when the parent thread that started this process dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, _SIGKILL)


def _child_setup(cpus: list[int] | None):
    """preexec_fn: die with bpslaunch; bind to the NUMA node's cores (BYTEPS_NUMA_ON).
    It imports and loads nothing in the child (see :func:`_libc_prctl`)."""
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


LINE_LIMIT = 1 << 20     # a longer line goes out in pieces of this size, each a line


def _pump(pipe, out, prefix: bytes, log=None, take=None) -> None:
    """Copy a child's output to ``out`` one whole line at a time, each behind ``prefix``
    (``b""``: untagged), under the one output lock: lines of several children never
    interleave mid-line, whatever ``out`` is (a terminal, a pipe, a file), however the
    child writes them.  Also to the binary file ``log`` without the prefix (bpslaunch -H
    --log-dir).  ``take(line)`` returns the part of a line that is output (it keeps the
    rest for bpslaunch itself: a remote worker's summary)."""
    try:
        for line in iter(lambda: pipe.readline(LINE_LIMIT), b""):
            if take is not None:
                line = take(line)
                if not line:
                    continue
            if not line.endswith(b"\n"):
                line += b"\n"
            with _OUT_LOCK:
                _before_output()
                for dst, text in ((out, prefix + line), (log, line)):
                    try:
                        if dst is not None:
                            dst.write(text)
                            dst.flush()
                    except (OSError, ValueError):
                        pass
    finally:
        pipe.close()


class Proc:
    """One child process; with ``tag``, its output lines are prefixed ``[tag] `` (``""``:
    piped through bpslaunch without a prefix)."""

    def __init__(self, what: str, argv: list[str], env: dict, critical: bool,
                 cpus: list[int] | None = None, tag: str | None = None):
        self.what, self.critical = what, critical
        self.spec = (argv, env, cpus, tag)        # to start it again (a restarted scheduler)
        self.seen_exit: float | None = None
        pipe = subprocess.PIPE if tag is not None else None
        if tag is not None and "PYTHONUNBUFFERED" not in env:
            env = dict(env, PYTHONUNBUFFERED="1")   # a pipe would buffer lines for minutes
        try:
            self.p = subprocess.Popen(argv, env=env, start_new_session=True, stdout=pipe,
                                      stderr=pipe, preexec_fn=_child_setup(cpus))
        except FileNotFoundError:
            raise LaunchError(f"{argv[0]}: command not found") from None
        except PermissionError:
            raise LaunchError(f"{argv[0]}: permission denied (not an executable file)",
                              126) from None
        except OSError as exc:
            raise LaunchError(f"{argv[0]}: cannot start it: {exc.strerror or exc}") from None
        self.pumps = []
        if tag is not None:
            prefix = f"[{tag}] ".encode() if tag else b""
            for src, dst in ((self.p.stdout, sys.stdout.buffer),
                             (self.p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, args=(src, dst, prefix), daemon=True,
                                     name=f"bpslaunch-output-{tag}")
                t.start()
                self.pumps.append(t)

    def kill(self, sig: int) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    if code == PEER_FAILED_EXIT:
        return f"exit code {code} (another process of the job failed)"
    return f"exit code {code}"


def _signal_death(p) -> bool:
    """Did ``p`` die of a signal?  (A -H process's ssh client exits 128 + N: _remote.py.)"""
    code = p.p.returncode
    return code is not None and (code < 0 or (hasattr(p, "role") and 128 < code < 160))


def _own_failure(code: int | None) -> bool:
    return code not in (None, 0, PEER_FAILED_EXIT)


def _spare_servers(services: list[Proc]) -> list[Proc]:
    """The servers whose death the job survives: all of them with BYTEPS_SERVER_REPLICAS=1
    (bpslaunch's environment, passed to every child; one death at most)."""
    if not variables.value("BYTEPS_SERVER_REPLICAS"):
        return []
    return [p for p in services if p.what.startswith("server")
            or getattr(getattr(p, "role", None), "kind", None) == "server"]    # bpslaunch -H


def say(text: str) -> None:
    with _OUT_LOCK:
        _before_output()
        print(f"bpslaunch: {text}", file=sys.stderr, flush=True)


def refuse(exc: Exception) -> int:
    """bpslaunch will not start the job: say why (``exc``: a ConfigError or a
    LaunchError) and return its exit code (a LaunchError's own, else 2)."""
    say(str(exc))
    return exc.code if isinstance(exc, LaunchError) else 2


class Job:
    """A set of child processes supervised together."""

    def __init__(self, status_dir: str | None = None, in_cluster: bool = False):
        self.procs: list[Proc] = []
        self.status_dir = status_dir
        self.in_cluster = in_cluster      # other processes of the job run elsewhere
        self.scheduler: Proc | None = None
        self.last_words: str | None = None
        self.workers: list[Proc] | None = None     # known once supervise() runs
        self.interrupted: float | None = None      # when SIGINT was forwarded to the workers
        self.on_tick = None        # called from the supervision loop (the live view)
        self.on_exit = None        # called with each child whose exit is seen (lost.py)
        self.survived: list[Proc] = []     # a dead server the job outlived (replication)
        # standalone: a scheduler killed by a signal is started again on the same address,
        # and the nodes wait for it (byteps/scheduler/resume.py)
        self.restart_scheduler = status_dir is not None and not in_cluster
        self.scheduler_restarts = 0
        self.signalled: int | None = None     # the first SIGINT/SIGTERM bpslaunch received
        self.finished = False       # the last line was said: signals end it quietly
        # the handler only records; the escalation thread acts (launcher/signals.py)
        signals.install(self)

    def kill_all(self, sig: int) -> None:
        """Send ``sig`` to every process of the job still running (any thread)."""
        for p in list(self.procs):
            if p.p.poll() is None:
                p.kill(sig)

    def start(self, what: str, argv: list[str], env: dict, critical: bool = True,
              cpus: list[int] | None = None, tag: str | None = None) -> Proc:
        if self.restart_scheduler:
            env = dict(env, BPSLAUNCH_SCHEDULER_RESTART="1")
        p = Proc(what, argv, env, critical, cpus, tag)
        self.procs.append(p)
        if signals.level() >= 2:        # the job is ending: a late start ends with it
            p.kill(signal.SIGTERM if signals.level() == 2 else signal.SIGKILL)
        return p

    def terminate(self, grace: float = TERM_GRACE_S) -> None:
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
        self.drain()

    def drain(self, timeout: float = 2.0) -> None:
        """Let the output of ended children reach the terminal (before the last line)."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            for t in p.pumps:
                t.join(max(0.0, deadline - time.monotonic()))

    def _note_exits(self, order: list[Proc]) -> None:
        now = time.monotonic()
        fresh = [p for p in self.procs if p.seen_exit is None and p.p.poll() is not None]
        fresh.sort(key=lambda p: p.p.returncode >= 0)   # a signal death first
        for p in fresh:
            p.seen_exit = now
            order.append(p)
            if self.on_exit is not None:
                self.on_exit(p)

    def supervise(self, workers: list[Proc], services: list[Proc]) -> int:
        """Wait for the workers; end everything on the first failure and name its root cause."""
        order: list[Proc] = []            # children in the order their exit was seen
        ending_since = None
        self.workers = workers
        spare = _spare_servers(services)
        while True:
            if self.interrupted is not None:
                return self._interrupt(workers)
            self._note_exits(order)
            self._maybe_restart_scheduler(services, order)
            self._survive(order, spare)
            root = next((p for p in order if _own_failure(p.p.returncode)
                         and p not in self.survived), None)
            if root is not None:
                return self._fail(root, order)
            if any(p.p.returncode == PEER_FAILED_EXIT for p in order):
                ending_since = ending_since or time.monotonic()
                if len(order) == len(self.procs) or \
                        time.monotonic() - ending_since > ROOT_CAUSE_WAIT_S:
                    return self._fail(None, order)
            elif all(w.p.poll() == 0 for w in workers):
                return self._finish(services)
            if self.on_tick is not None:
                self.on_tick()
            time.sleep(0.05)

    def _maybe_restart_scheduler(self, services: list[Proc], order: list[Proc]) -> None:
        """A scheduler killed by a signal: start a new one on the same address (the nodes
        register again and the job goes on), at most MAX_SCHEDULER_RESTARTS times."""
        old = self.scheduler
        if not self.restart_scheduler or old is None or old.p.poll() is None or \
                not _signal_death(old) or self.interrupted is not None or \
                self.scheduler_restarts >= MAX_SCHEDULER_RESTARTS:
            return
        self.scheduler_restarts += 1
        if hasattr(old, "role"):            # bpslaunch -H: through its session (ssh.py)
            new = old.respawn(self)
        else:
            argv, env, cpus, tag = old.spec
            new = self.start(old.what, argv, env, old.critical, cpus, tag)
        self.procs.remove(old)
        if old in order:
            order.remove(old)
        if old in services:
            services[services.index(old)] = new
        self.scheduler = new
        say(f"the scheduler (pid {old.p.pid}) died with {describe_code(old.p.returncode)}; "
            f"started a new one (pid {new.p.pid}) on the same address, restart "
            f"{self.scheduler_restarts} of {MAX_SCHEDULER_RESTARTS}")

    def _survive(self, order: list[Proc], spare: list[Proc]) -> None:
        """BYTEPS_SERVER_REPLICAS=1: the first server that dies is not the job's failure
        (its backup takes over; the scheduler ends the job if it cannot)."""
        for p in order:
            if p in spare and p not in self.survived and _own_failure(p.p.returncode) \
                    and not any(_own_failure(q.p.returncode) for q in order
                                if q not in spare) and len(self.survived) < 1:
                self.survived.append(p)
                say(f"{p.what} (pid {p.p.pid}) died with {describe_code(p.p.returncode)}; "
                    f"BYTEPS_SERVER_REPLICAS=1: its backup server takes over, the job goes on")

    def _interrupt(self, workers: list[Proc]) -> int:
        """After SIGINT or SIGTERM: the escalation thread signals the workers (SIGINT, then
        SIGTERM after the grace period, then SIGKILL); wait for them, then end the rest."""
        _wait_until(lambda: all(w.p.poll() is not None for w in workers),
                    GRACE_PERIOD_S + 2 * TERM_GRACE_S + 5)
        self.terminate()
        signum = self.signalled or signal.SIGINT
        name = signal.Signals(signum).name
        late = signals.late_workers()
        if signum == signal.SIGINT and signals.level() <= 2:
            self.last_words = (f"job interrupted (SIGINT): {len(workers) - late} of "
                               f"{len(workers)} worker(s) ended within the grace period"
                               + (f", {late} terminated" if late else ""))
        else:
            self.last_words = (f"job ended by {name}: every process of the job was "
                               + ("killed (SIGKILL)" if signals.level() >= 3 else
                                  "terminated"))
        return 128 + signum

    def _finish(self, services: list[Proc]) -> int:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(s.p.poll() is None for s in services):
            time.sleep(0.05)
        bad = [s for s in services if s.p.poll() not in (0, None) and s not in self.survived]
        self.terminate(grace=1.0)
        for s in bad[1:]:
            say(f"{s.what} failed with {describe_code(s.p.returncode)}")
        if bad:             # every worker finished; a service died at the end (said last)
            self.last_words = (f"job failed; root cause: {bad[0].what} (pid {bad[0].p.pid}) "
                               f"failed with {describe_code(bad[0].p.returncode)} after every "
                               f"worker finished")
        return 1 if bad else 0

    def _fail(self, root: Proc | None, order: list[Proc]) -> int:
        if root is not None:
            first = f"{root.what} (pid {root.p.pid}) failed with {describe_code(root.p.returncode)}"
        else:
            first = (f"{order[0].what} (pid {order[0].p.pid}) ended because another process "
                     f"of the job failed")
        say(f"{first}; ending the job")
        self._wait_for_scheduler_reason()
        self._wait_for_workers()
        self.terminate()
        # said last (by the caller, after its clean-up), so that follow-on errors of other
        # processes do not bury it
        self.last_words = f"job failed; root cause: {self.root_cause(root)}"
        if root is not None:
            code = root.p.returncode
            return code if code > 0 else 128 - code
        return PEER_FAILED_EXIT if self.in_cluster else 1

    def _wait_for_scheduler_reason(self, limit: float = 2.0) -> None:
        """The scheduler tells everyone first and then leaves its reason: give it a moment."""
        sched = self.scheduler
        _wait_until(lambda: sched is None or sched.p.poll() is not None
                    or sched.p.pid in self.reasons(), limit)

    def _wait_for_workers(self, limit: float = WORKER_EXIT_WAIT_S) -> None:
        """Every worker has been told of the failure: let them end by themselves first (a
        worker SIGTERMed while it handles the error loses its ``finally`` blocks)."""
        _wait_until(lambda: all(w.p.poll() is not None for w in self.workers or []), limit)

    def say_last(self) -> None:
        """Print the root-cause line (if the job failed) as bpslaunch's last line."""
        self.finished = True
        if self.last_words:
            say(self.last_words)
            self.last_words = None

    def reasons(self) -> dict[int, str]:
        """{pid: reason} that children left in the status folder (byteps.common.node)."""
        out: dict[int, str] = {}
        folder = self.status_dir
        for name in sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []:
            if name.startswith("reason.") and name[7:].isdigit():
                try:
                    with open(os.path.join(folder, name), errors="replace") as f:
                        out[int(name[7:])] = f.read().strip()
                except OSError:
                    pass
        return out

    def root_cause(self, root: Proc | None) -> str:
        reasons = self.reasons()
        said = reasons.get(self.scheduler.p.pid) if self.scheduler is not None else None
        if root is not None:
            text = f"{root.what} (pid {root.p.pid}) failed with {describe_code(root.p.returncode)}"
            if root is self.scheduler and said:
                return f"the scheduler (pid {root.p.pid}) ended the job: {said}"
            own = reasons.get(root.p.pid)       # the error it left (byteps/core/api/exit.py)
            if said and root.p.returncode == 1 and " exited with an error: " in said:
                # several ranks failed with an error: the first one the scheduler heard of
                return said.replace(" exited with an error: ", " failed with exit code 1: ", 1)
            if own and root.p.returncode != PEER_FAILED_EXIT:
                text = f"{text}: {own}"
            return f"{text}; the scheduler: {said}" if said and said not in text else text
        if said:
            return f"the scheduler ended the job: {said}"
        told = next((r for pid, r in reasons.items()), None)
        where = "another machine" if self.in_cluster else "a process of the job"
        text = (f"every process of this bpslaunch ended because {where} failed (exit code "
                f"{PEER_FAILED_EXIT})")
        return f"{text}: {told}" if told else f"{text}; see the scheduler's log for the reason"

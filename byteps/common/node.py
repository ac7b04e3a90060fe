"""What every server and worker shares: the link to the scheduler.

Registration, heartbeats and liveness of the scheduler.  The socket is used
by one thread at a time (the caller of :meth:`register`, then the owner's
event loop).  Also the process-level failure policy shared by the roles:
a cluster node needs the job secret, and a worker whose job failed ends
its process even when its main thread never calls BytePS again.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time

import zmq

from byteps import transport
from byteps.common.config import Config
from byteps.common.errors import PEER_FAILED_EXIT, BytePSError  # noqa: F401 (node's name)
from byteps.transport.shm import machine_id
from byteps.transport.wire import Op, WireError, decode, encode, new_seq

log = logging.getLogger(__name__)

# After a fatal job error a worker's main thread gets this long to notice (any
# BytePS call raises); then it is interrupted (KeyboardInterrupt), and after
# as long again the process exits with PEER_FAILED_EXIT.
EXIT_GRACE_S = 2.0


def require_secret(cfg: Config, what: str) -> None:
    """Refuse to join a cluster without BYTEPS_JOB_SECRET (unless auth is disabled)."""
    if cfg.auth_disable:
        log.warning("%s: BYTEPS_AUTH_DISABLE=1: messages are not authenticated; anyone who can "
                    "reach this job's ports can join it or feed it data", what)
    if cfg.job_secret or cfg.auth_disable:
        return
    raise BytePSError(
        f"{what}: BYTEPS_JOB_SECRET is not set; every node of a distributed job must share a "
        f"secret that authenticates its messages (generate one with `python -c \"import "
        f"secrets; print(secrets.token_hex(16))\"` and export it on every node; `bpslaunch "
        f"--standalone` does this for you), or set BYTEPS_AUTH_DISABLE=1 on a trusted "
        f"network. See docs/security.md")


RESTART_WAIT_S = 30.0       # how long a node waits for a restarted scheduler (bpslaunch)


def down_grace(cfg: Config) -> float:
    """How long a closed TCP connection may stay down before its peer is presumed dead."""
    return min(cfg.heartbeat_timeout, 2 * cfg.heartbeat_interval + 0.5)


class SchedulerLink:
    """DEALER connection to the scheduler, with heartbeats."""

    def __init__(self, cfg: Config, ctx: zmq.Context, role: str, identity: bytes | None = None):
        require_secret(cfg, role)
        self.cfg = cfg
        self.role = role
        self.secret = cfg.job_secret.encode() if cfg.job_secret else None
        self.address = f"tcp://{cfg.root_uri}:{cfg.root_port}"
        if identity is None:     # unguessable: the scheduler hands over routing ids
            identity = f"{role[0]}/{os.getpid()}/".encode() + secrets.token_hex(8).encode()
        self.sock = transport.connect(ctx, self.address, identity)
        _install_excepthook()
        self.watch = _LinkWatch(self.sock)
        self.down_since: float | None = None
        self.node_id = -1
        self.epoch = 0
        self.seq = new_seq()
        self.last_seq = -1                  # last seq accepted from the scheduler
        self.last_heard = time.monotonic()
        self.last_beat = 0.0
        self.drops = transport.RateLimitedLog(log)
        self.beat = None     # () -> dict: a heartbeat's body (a worker's report, api/reporter.py)
        # bpslaunch restarts a scheduler that dies on the same address: wait for it a while
        # and register again with what this node is (byteps/scheduler/resume.py)
        self.restartable = os.environ.get("BPSLAUNCH_SCHEDULER_RESTART") == "1"
        self.registered: tuple | None = None    # (registration body, book) once registered
        self.registering: dict | None = None    # the registration body sent

    def send(self, op: int, body: dict) -> None:
        self.seq += 1
        self.sock.send_multipart(encode(self.cfg.job_id, self.node_id, op, self.epoch,
                                        self.seq, body, self.secret))

    def recv(self):
        """One validated message from the scheduler, or None if it was dropped."""
        frames = self.sock.recv_multipart(copy=True)
        try:
            hdr, _ = decode(frames, self.cfg.job_id, self.secret)
        except WireError as exc:
            self.drops.warn("message from scheduler", str(exc))
            return None
        if hdr.sender != 0:
            self.drops.warn("message on the scheduler link from a non-scheduler",
                            f"sender {hdr.sender}")
            return None
        if hdr.seq <= self.last_seq or hdr.epoch < self.epoch:
            self.drops.warn("replayed or stale message from scheduler",
                            f"seq {hdr.seq} (last {self.last_seq}), epoch {hdr.epoch} "
                            f"(current {self.epoch})")
            return None
        self.last_seq = hdr.seq
        self.last_heard = time.monotonic()
        return hdr

    def register(self, info: dict, what: str) -> dict:
        """Register and wait for the address book.  Raises BytePSError on refusal/timeout.
        A worker process that was in a job before (init() again after shutdown()) raises
        when nothing listens at the scheduler's address for REFUSED_END_S, instead of
        waiting the start-up timeout for a scheduler that is gone (the job ended)."""
        ended = _ended_text(self.cfg) if self.role == "worker" and _WORKER_WAS_IN_A_JOB else None
        body = {"role": self.role, "host": self.cfg.node_host, "host_id": self.cfg.host_id,
                "pid": os.getpid(), "hostname": socket.gethostname(), "machine": machine_id(),
                "num_worker": self.cfg.num_worker, "num_server": self.cfg.num_server,
                "local_rank": self.cfg.local_rank, "local_size": self.cfg.local_size,
                "worker_id": -1 if self.cfg.worker_id is None else self.cfg.worker_id,
                "replicas": self.cfg.server_replicas}     # every node must agree (failover)
        body.update(info)
        self.registering = body
        self.send(Op.REGISTER, body)
        limit = self.cfg.startup_timeout + 15
        deadline = time.monotonic() + limit
        while True:
            now = time.monotonic()
            self.check_connection(now, what)
            left = deadline - now
            refused = self.watch.refused_for(now)
            if ended is not None and refused > REFUSED_END_S:
                raise BytePSError(f"{what}: nothing listens at the scheduler's address "
                                  f"{self.address} (connection refused for {refused:.1f} s): "
                                  f"{ended}")
            if left <= 0:
                raise BytePSError(
                    f"{what}: scheduler unreachable at {self.address} (no answer to registration "
                    f"within {limit:.0f} s); check DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT, "
                    f"BYTEPS_JOB_SECRET, and that the scheduler runs")
            if not self.sock.poll(int(min(left, 0.2) * 1000) + 1):
                continue
            hdr = self.recv()
            if hdr is None:
                continue
            if hdr.op in (Op.TERMINATE, Op.NODE_DEAD):
                note_job_failed(str(hdr.body.get("reason", "?")))
                raise BytePSError(f"{what}: the job ended before it formed: "
                                  f"{hdr.body.get('reason', '?')}")
            if hdr.op == Op.REFUSED:
                raise BytePSError(f"{what}: the scheduler refused registration: "
                                  f"{hdr.body.get('reason', '?')}")
            if hdr.op == Op.REGISTER_OK:
                self.node_id = _int(hdr.body, "node_id")
                self.epoch = hdr.epoch
                self.last_heard = time.monotonic()
                self.registered = (body, hdr.body)
                if self.role == "worker":
                    _WORKER_WAS_IN_A_JOB.append(True)
                return hdr.body

    def check_connection(self, now: float, what: str | None = None) -> None:
        """Raise if the TCP connection to the scheduler closed and stayed down."""
        for kind, _, _ in self.watch.poll():
            if kind == "down":
                self.down_since = self.down_since or now
            else:
                if self.down_since is not None and self.restartable and self.registering:
                    self.resume()
                self.down_since = None
        grace = down_grace(self.cfg) + (RESTART_WAIT_S if self.restartable else 0)
        if self.down_since is not None and now - self.down_since > grace \
                and self.last_heard < self.down_since:
            raise BytePSError(f"{what or self.role}: scheduler unreachable at {self.address}: "
                              f"its connection closed {now - self.down_since:.1f} s ago and did "
                              f"not come back (did the scheduler process die?); the job cannot "
                              f"continue")

    def tick(self, now: float) -> None:
        """Send a heartbeat when due; raise BytePSError if the scheduler went silent."""
        if now - self.last_beat >= self.cfg.heartbeat_interval:
            self.last_beat = now
            self.send(Op.HEARTBEAT, _beat_body(self.beat))
        self.check_connection(now)
        if now - self.last_heard > self.cfg.heartbeat_timeout + \
                (RESTART_WAIT_S if self.restartable else 0):
            raise BytePSError(f"{self.role}: scheduler unreachable at {self.address}: no "
                              f"heartbeat answer for {now - self.last_heard:.1f} s "
                              f"(BYTEPS_HEARTBEAT_TIMEOUT={self.cfg.heartbeat_timeout:g}); the "
                              f"job cannot continue")

    def resume(self) -> None:
        """The connection to the scheduler came back (a restarted scheduler): register again
        with this node's id, rank and epoch (before the job formed: as the first time)."""
        log.info("%s: the scheduler's connection is back; registering again", self.role)
        if self.registered is None:
            self.send(Op.REGISTER, self.registering)
            return
        body, book = self.registered
        self.send(Op.REGISTER, dict(body, resume={
            "node_id": self.node_id, "rank": book.get("rank", -1), "epoch": self.epoch,
            "size": book.get("size", 0)}))

    def close(self, linger_ms: int = 0) -> None:
        """Close; with ``linger_ms`` queued messages (LEAVE, EXIT) still go out."""
        self.watch.close()
        self.sock.close(linger_ms)


class _LinkWatch(transport.ConnWatch):
    """The link's connection events, and since when every attempt to connect was refused
    (ZeroMQ's EVENT_CONNECT_RETRIED, one per attempt, every reconnect interval): a sign that
    no scheduler runs, which no other event gives.  Missing one of these events only delays
    the sign; a connection that is up (or one that never answers) never produces it."""
    EVENTS = transport.ConnWatch.EVENTS | zmq.EVENT_CONNECT_RETRIED

    def __init__(self, sock: zmq.Socket):
        super().__init__(sock)
        self.mon = _RetryCount(self.mon)

    def refused_for(self, now: float) -> float:
        """Seconds since the first of an unbroken run of refused attempts (0: none)."""
        self.poll()
        first = self.mon.first_refused
        return 0.0 if first is None else now - first

    def poll(self):
        out = super().poll()
        if out:                   # a connection came up or went down: a new run starts
            self.mon.first_refused = None
        return out


class _RetryCount:
    """The monitor socket, noting EVENT_CONNECT_RETRIED as its messages are read."""

    def __init__(self, mon):
        self._mon, self.first_refused = mon, None

    def __getattr__(self, name):
        return getattr(self._mon, name)

    def recv_multipart(self, *a, **k):
        msg = self._mon.recv_multipart(*a, **k)
        if len(msg[0]) >= 2 and int.from_bytes(msg[0][:2], sys.byteorder) == \
                zmq.EVENT_CONNECT_RETRIED and self.first_refused is None:
            self.first_refused = time.monotonic()
        return msg


# init() again after shutdown(): this long of refused connections means the scheduler is gone
# (a new scheduler that the same script starts binds within a few seconds, even under load)
REFUSED_END_S = 10.0
_WORKER_WAS_IN_A_JOB: list = []      # a worker link of this process registered once


def _ended_text(cfg: Config) -> str:
    """Why a scheduler is gone when a worker process that was in a job calls init() again."""
    return (f"this process called shutdown() before, and its job has ended: a job ends "
            f"BYTEPS_REINIT_WAIT_S={cfg.reinit_wait_s:g} s after all of its workers called "
            f"shutdown() unless they call init() again, and when its workers exit. To go on, "
            f"start a new scheduler and servers before init() (as the original BytePS's tests "
            f"do), or keep the job: call init() again on every worker within "
            f"BYTEPS_REINIT_WAIT_S")


def _beat_body(beat) -> dict:
    if beat is None:
        return {}
    try:
        return {"report": beat()}
    except Exception as exc:   # noqa: BLE001 - a report must never stop the heartbeats
        log.debug("no report with this heartbeat: %r", exc)
        return {}


def _int(body: dict, name: str) -> int:
    v = body.get(name)
    if type(v) is not int:
        raise WireError(f"field {name!r} must be an integer, got {type(v).__name__}")
    return v


def field(body: dict, name: str, typ, default=None):
    """Validated field of a control message body (raises WireError)."""
    v = body.get(name, default)
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise WireError(f"field {name!r} must be {typ}, got {type(v).__name__}")
    return v


def describe(info: dict) -> str:
    """'worker rank 1 (host h, pid 42)' for a node of the address book."""
    role = info.get("role", "node")
    rank = info.get("rank", -1)
    r = f" rank {rank}" if isinstance(rank, int) and rank >= 0 else f" {info.get('node_id')}"
    at = f" at {info['address']}" if role == "server" and info.get("address") else ""
    return f"{role}{r}{at} (host {info.get('host_id') or info.get('host')}, pid {info.get('pid')})"


def held_tensors(held: dict, limit: int = 20) -> str:
    """'tensors 'a' (key 1), 'b' (key 2)' for a {key: name} map of what a server held."""
    if not held:
        return "no tensors of this worker"
    items = sorted(held.items(), key=lambda kv: kv[1])
    text = ", ".join(f"{name!r} (key {key})" for key, name in items[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} tensor(s) of this worker: {text}{more}"


_EXITING = threading.Event()
_JOB_FAILED = threading.Event()
_HOOKED = False


def note_job_failed(reason: str) -> None:
    """This process learned that the job failed elsewhere: it ends with PEER_FAILED_EXIT.

    Under bpslaunch the reason is also left in ``$BPSLAUNCH_STATUS_DIR/reason.<pid>``
    for its report.
    """
    if _JOB_FAILED.is_set():
        return
    _JOB_FAILED.set()
    leave_reason(reason)


def leave_reason(reason: str) -> None:
    """Tell bpslaunch (``$BPSLAUNCH_STATUS_DIR``) why this process ends the job."""
    folder = os.environ.get("BPSLAUNCH_STATUS_DIR")
    if folder:
        try:
            with open(os.path.join(folder, f"reason.{os.getpid()}"), "w") as f:
                f.write(reason[:4000])
        except OSError:
            pass


def failure_exit_code() -> int:
    """PEER_FAILED_EXIT once the job failed elsewhere, else 1."""
    return PEER_FAILED_EXIT if _JOB_FAILED.is_set() else 1


def _install_excepthook() -> None:
    """An uncaught BytePSError (or the watchdog's KeyboardInterrupt) caused by a failure
    elsewhere ends the process with PEER_FAILED_EXIT instead of Python's 1."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    prev = sys.excepthook

    def hook(tp, val, tb):
        prev(tp, val, tb)
        # the engine fails the handles a moment before it notes the failure: wait briefly
        if _from_job_failure(val) and _JOB_FAILED.wait(1.0):
            _exit_now(PEER_FAILED_EXIT)
    sys.excepthook = hook


def _from_job_failure(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (BytePSError, KeyboardInterrupt)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _exit_now(code: int) -> None:
    """Run the exit handlers (they tell the scheduler, remove segments), then exit."""
    import atexit
    try:
        atexit._run_exitfuncs()
    finally:
        _say_flush()
        os._exit(code)


def _say_flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def end_process_later(what: str, err: BaseException, grace: float = EXIT_GRACE_S) -> None:
    """After a fatal job error, make sure this worker process ends.

    The main thread gets ``grace`` seconds to notice by itself (every BytePS
    call raises the error).  A main thread that does not call BytePS (data
    loading, evaluation, a sleep) is then interrupted with SIGINT
    (KeyboardInterrupt); if the process is still alive ``grace`` seconds
    later it exits with code 1.
    """
    if _EXITING.is_set():
        return
    _EXITING.set()
    note_job_failed(str(err))

    def run() -> None:
        time.sleep(grace)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            _say(f"{what}: the job failed ({err}); the main thread did not stop within "
                 f"{grace:g} s, interrupting it")
            try:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            except (OSError, ValueError):
                pass
            time.sleep(grace)
        _say(f"{what}: the job failed ({err}); exiting this worker process with code "
             f"{PEER_FAILED_EXIT}")
        _say_flush()
        os._exit(PEER_FAILED_EXIT)

    threading.Thread(target=run, name="byteps-exit-watchdog", daemon=True).start()


def _say(text: str) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.write(f"byteps: {text}\n")
        sys.stderr.flush()
    except Exception:   # stderr closed: still exit
        pass

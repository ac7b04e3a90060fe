"""What every server and worker shares: the link to the scheduler.

Registration, heartbeats and liveness of the scheduler.  The socket is used
by one thread at a time (the caller of :meth:`register`, then the owner's
event loop).
"""
from __future__ import annotations

import logging
import os
import socket
import time

import zmq

from byteps import transport
from byteps.core.config import Config
from byteps.transport.wire import Op, WireError, decode, encode

log = logging.getLogger(__name__)


class BytePSError(RuntimeError):
    """A BytePS operation failed; the message names the tensor, ranks and the fix."""


class SchedulerLink:
    """DEALER connection to the scheduler, with heartbeats."""

    def __init__(self, cfg: Config, ctx: zmq.Context, role: str, identity: bytes | None = None):
        self.cfg = cfg
        self.role = role
        self.secret = cfg.job_secret.encode() if cfg.job_secret else None
        self.address = f"tcp://{cfg.root_uri}:{cfg.root_port}"
        self.sock = transport.connect(ctx, self.address, identity)
        self.node_id = -1
        self.epoch = 0
        self.seq = 0
        self.last_heard = time.monotonic()
        self.last_beat = 0.0
        self.drops = transport.RateLimitedLog(log)

    def send(self, op: int, body: dict) -> None:
        self.seq += 1
        self.sock.send_multipart(encode(self.cfg.job_id, self.node_id, op, self.epoch,
                                        self.seq, body, self.secret))

    def recv(self):
        """One validated message from the scheduler, or None if it was malformed."""
        frames = self.sock.recv_multipart(copy=True)
        try:
            hdr, _ = decode(frames, self.cfg.job_id, self.secret)
        except WireError as exc:
            self.drops.warn("message from scheduler", str(exc))
            return None
        self.last_heard = time.monotonic()
        return hdr

    def register(self, info: dict, what: str) -> dict:
        """Register and wait for the address book.  Raises BytePSError on refusal/timeout."""
        body = {"role": self.role, "host": self.cfg.node_host, "host_id": self.cfg.host_id,
                "pid": os.getpid(), "hostname": socket.gethostname(),
                "num_worker": self.cfg.num_worker, "num_server": self.cfg.num_server,
                "local_rank": self.cfg.local_rank, "local_size": self.cfg.local_size,
                "worker_id": -1 if self.cfg.worker_id is None else self.cfg.worker_id}
        body.update(info)
        self.send(Op.REGISTER, body)
        deadline = time.monotonic() + self.cfg.startup_timeout + 15
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise BytePSError(
                    f"{what}: scheduler unreachable at {self.address} (no answer to registration "
                    f"within {self.cfg.startup_timeout + 15:.0f} s); check DMLC_PS_ROOT_URI/"
                    f"DMLC_PS_ROOT_PORT and that the scheduler runs")
            hdr = self.recv()
            if hdr is None:
                continue
            if hdr.op in (Op.TERMINATE, Op.NODE_DEAD):
                raise BytePSError(f"{what}: the job ended before it formed: "
                                  f"{hdr.body.get('reason', '?')}")
            if hdr.op == Op.REFUSED:
                raise BytePSError(f"{what}: the scheduler refused registration: "
                                  f"{hdr.body.get('reason', '?')}")
            if hdr.op == Op.REGISTER_OK:
                self.node_id = _int(hdr.body, "node_id")
                self.epoch = hdr.epoch
                self.last_heard = time.monotonic()
                return hdr.body

    def tick(self, now: float) -> None:
        """Send a heartbeat when due; raise BytePSError if the scheduler went silent."""
        if now - self.last_beat >= self.cfg.heartbeat_interval:
            self.last_beat = now
            self.send(Op.HEARTBEAT, {})
        if now - self.last_heard > self.cfg.heartbeat_timeout:
            raise BytePSError(f"scheduler unreachable at {self.address}: no heartbeat answer for "
                              f"{now - self.last_heard:.1f} s (BYTEPS_HEARTBEAT_TIMEOUT="
                              f"{self.cfg.heartbeat_timeout:g}); the job cannot continue")

    def close(self) -> None:
        self.sock.close(0)


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
    r = f" rank {info['rank']}" if info.get("rank", -1) >= 0 else f" {info.get('node_id')}"
    return f"{role}{r} (host {info.get('host_id') or info.get('host')}, pid {info.get('pid')})"

"""Transports chosen by address scheme (``tcp://``, ``ipc://``; ``rdma://`` later).

A backend makes listening (ROUTER) and connecting (DEALER) sockets for an
address.  Every listening socket gets a maximum message size so that an
oversize frame is dropped by ZeroMQ before it is allocated.
"""
from __future__ import annotations

import logging
import os
import random
import socket as _socket
import time

import zmq

from byteps.transport import congestion as _cc
from byteps.transport import wire

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """An address or socket could not be set up."""


class ZmqBackend:
    """ZeroMQ over tcp:// and ipc://."""

    schemes = ("tcp", "ipc")

    def listen(self, ctx: zmq.Context, address: str, max_msg_bytes: int) -> tuple[zmq.Socket, str]:
        """Bind a ROUTER socket; ``tcp://host:0`` picks a free port.  Returns (socket, address)."""
        s = ctx.socket(zmq.ROUTER)
        _common(s)
        s.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            if address.startswith("tcp://") and address.endswith(":0"):
                port = s.bind_to_random_port(address[:-2])
                address = f"{address[:-2]}:{port}"
            else:
                s.bind(address)
        except zmq.ZMQError as exc:
            s.close(0)
            raise TransportError(f"cannot listen on {address}: {exc} (is the port in use, or "
                                 f"is DMLC_NODE_HOST not an address of this machine?)") from None
        return s, address

    def connect(self, ctx: zmq.Context, address: str, identity: bytes | None = None) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        _common(s)
        if identity:
            s.setsockopt(zmq.IDENTITY, identity)
        s.connect(address)
        return s


def _common(s: zmq.Socket) -> None:
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.TCP_KEEPALIVE, 1)


class UnavailableBackend:
    def __init__(self, scheme: str, why: str):
        self.schemes = (scheme,)
        self.why = why

    def listen(self, *a, **k):
        raise TransportError(self.why)

    connect = listen


BACKENDS: dict[str, object] = {}


def register(backend) -> None:
    for scheme in backend.schemes:
        if scheme in BACKENDS and not isinstance(BACKENDS[scheme], UnavailableBackend):
            raise TransportError(f"a backend for {scheme}:// is already registered")
        BACKENDS[scheme] = backend


register(ZmqBackend())
BACKENDS["rdma"] = UnavailableBackend(
    "rdma", "rdma:// needs pyverbs and an RDMA device; none is available in this build")


def backend_for(address: str):
    scheme, sep, _ = address.partition("://")
    if not sep:
        raise TransportError(f"address {address!r} has no scheme; use e.g. tcp://10.0.0.1:9000")
    try:
        return BACKENDS[scheme]
    except KeyError:
        raise TransportError(f"unknown transport scheme {scheme!r} in {address!r}; known: "
                             f"{', '.join(sorted(BACKENDS))}") from None


def listen(ctx, address, max_msg_bytes):
    return backend_for(address).listen(ctx, address, max_msg_bytes)


def connect(ctx, address, identity=None):
    return backend_for(address).connect(ctx, address, identity)


class RateLimitedLog:
    """Log dropped messages at most once per ``period`` seconds per kind of reason.

    The kind is ``what`` plus the detail with its numbers masked (so "bad
    credential" and "not msgpack" are reported separately, but a flood of
    either costs one line per period); at most ``MAX_KINDS`` kinds are kept
    so that attacker-chosen text cannot grow memory.
    """

    MAX_KINDS = 256

    def __init__(self, logger: logging.Logger, period: float = 5.0):
        self.logger, self.period = logger, period
        self.last: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def warn(self, what: str, detail: str) -> None:
        now = time.monotonic()
        kind = what + "|" + "".join("N" if c.isdigit() else c for c in detail[:48])
        if kind not in self.last and len(self.last) >= self.MAX_KINDS:
            kind = what
        self.count[kind] = self.count.get(kind, 0) + 1
        if now - self.last.get(kind, -1e9) >= self.period:
            self.last[kind] = now
            n = self.count.pop(kind)
            self.logger.warning("dropped %s: %s (%d such message(s) since last report)",
                                what, detail[:500], n)


class SeqTracker:
    """Replay guard: the seq of each stream (keyed by sender) must strictly increase."""

    def __init__(self):
        self.last: dict = {}

    def accept(self, key, seq: int) -> bool:
        if seq <= self.last.get(key, -1):
            return False
        self.last[key] = seq
        return True

    def forget(self, key=None) -> None:
        if key is None:
            self.last.clear()
        else:
            self.last.pop(key, None)


class Dropper:
    """BYTEPS_TEST_DROP_RATE: drop this fraction of received data messages (seeded)."""

    def __init__(self, rate: float, seed: int):
        self.rate = rate
        self.rng = random.Random(seed)
        self.seen = self.dropped = 0

    def drop(self) -> bool:
        if self.rate <= 0:
            return False
        self.seen += 1
        if self.rng.random() < self.rate:
            self.dropped += 1
            return True
        return False


class ConnWatch:
    """TCP connection events of one socket (a ZeroMQ socket monitor), read without blocking.

    ``poll()`` returns ``(kind, fd, peer)`` tuples, kind one of ``"up"`` (a
    connection finished its handshake), ``"down"`` (a connection closed: the
    peer died or left, or ZeroMQ dropped it for an oversize or malformed
    stream).  For listening sockets ``peer`` is the remote address when known.

    ``congestion``: the ``BYTEPS_TCP_CONGESTION`` setting that chooses the TCP congestion
    control of the socket's connections (:func:`byteps.transport.congestion.choice`; None:
    unset, "host": the host's default).
    """

    EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
              | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    made = 0

    def __init__(self, sock: zmq.Socket, congestion: str | None = _cc.HOST):
        self.sock, self.congestion = sock, _cc.choice(congestion)
        ConnWatch.made += 1       # a unique address: a re-created socket may reuse an fd
        self.mon = sock.get_monitor_socket(
            self.EVENTS, f"inproc://byteps-monitor-{os.getpid()}-{ConnWatch.made}")
        self.peers: dict[int, str] = {}
        if self.congestion and sock.type == zmq.DEALER:
            # a connection that came up before the monitor was attached reports no event
            endpoint = sock.get(zmq.LAST_ENDPOINT).decode(errors="replace")
            _cc.sweep(endpoint, congestion)

    def poll(self) -> list[tuple[str, int, str]]:
        try:                      # the common case (no event), without raising zmq.Again
            if not self.mon.get(_EVENTS) & _POLLIN:
                return []
        except zmq.ZMQError:      # closed
            return []
        from zmq.utils.monitor import parse_monitor_message
        out = []
        while True:
            try:
                msg = self.mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            except zmq.ZMQError:
                return out
            ev = parse_monitor_message(msg)
            kind, fd = ev["event"], int(ev["value"])
            if kind in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
                self.peers[fd] = _peer_name(fd) or ev["endpoint"].decode(errors="replace")
                if self.congestion:
                    _cc.apply(fd, self.congestion.name, None, self.congestion.short_only)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                out.append(("up", -1, ev["endpoint"].decode(errors="replace")))
            elif kind == zmq.EVENT_DISCONNECTED:
                peer = self.peers.pop(fd, None) or ev["endpoint"].decode(errors="replace")
                out.append(("down", fd, peer))

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(0)


def _peer_name(fd: int) -> str | None:
    try:
        s = _socket.fromfd(fd, _socket.AF_INET, _socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        host, port = s.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, TypeError):
        return None
    finally:
        s.close()


try:
    from zmq.backend import Socket as _Backend      # what zmq.Socket wraps in Python
    _send = _Backend.send
except ImportError:                                 # pragma: no cover (other pyzmq)
    _send = zmq.Socket.send
_COPY_MAX = 65536     # pyzmq copies smaller frames even when asked not to (copy_threshold)
_SNDMORE, _NOBLOCK, _POLLIN, _EVENTS = (int(zmq.SNDMORE), int(zmq.NOBLOCK), int(zmq.POLLIN),
                                         int(zmq.EVENTS))


def send_frames(sock: zmq.Socket, frames: list) -> None:
    """``sock.send_multipart(frames, copy=False)`` for less CPU: no per-frame flag arithmetic
    (pyzmq combines ``IntFlag`` members), pyzmq's C-level send without its Python wrapper,
    and small ``bytes`` frames (headers, MACs, identities) copied straight away instead of
    through a ``Frame`` (pyzmq copies frames under 64 KB anyway)."""
    if not isinstance(sock, zmq.Socket):       # a stand-in (tests/test_engine_unit.py)
        return sock.send_multipart(frames, copy=False)
    last = len(frames) - 1
    for i, f in enumerate(frames):
        _send(sock, f, _SNDMORE if i < last else 0, type(f) is bytes and len(f) < _COPY_MAX)


def recv_frames(sock: zmq.Socket, block: bool = True) -> list | None:
    """All frames of the next message (``copy=False``); with ``block=False`` None when none
    is waiting (checked through ZMQ_EVENTS, not by raising ``zmq.Again``)."""
    if not isinstance(sock, zmq.Socket):       # a stand-in (tests/test_engine_unit.py)
        return sock.recv_multipart(copy=False) if block or sock.poll(0) else None
    if not block and not sock.get(_EVENTS) & _POLLIN:
        return None
    f = sock.recv(0, copy=False)
    parts = [f]
    while f.more:
        f = sock.recv(0, copy=False)
        parts.append(f)
    return parts


def source_fd(frame) -> int:
    """The file descriptor a received (copy=False) frame came in on, or -1."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (AttributeError, zmq.ZMQError, TypeError, ValueError):
        return -1


__all__ = ["listen", "connect", "backend_for", "register", "TransportError", "wire",
           "RateLimitedLog", "SeqTracker", "Dropper", "ConnWatch", "source_fd", "send_frames",
           "recv_frames"]

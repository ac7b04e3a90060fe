"""The TCP congestion control of byteps's own connections (``BYTEPS_TCP_CONGESTION``).

ZeroMQ opens the TCP sockets, so the choice is applied to each connection once it exists:
:class:`byteps.transport.ConnWatch` sets it on every connection its socket monitor
reports (accepted or connected, reconnections too) and, when it starts watching a
connecting socket, on the connection that may already be up (:func:`sweep`).  Linux lets
a connection change its congestion control while it carries data.

Why a job would choose: a parameter server's links carry one flow per (worker, server)
pair, several sharing each link, and a server answers a partition only once every worker
pushed it.  With bbr (v1) on the hosts, each flow that has not seen its minimum round
trip again for 10 s holds itself at 4 packets for 200 ms (ProbeRTT); behind the queue the
other flows keep, that is a stall of the one flow every server waits for.  docs/scaling.md
has what was measured.  Unset, connections keep the host's default.
"""
from __future__ import annotations

import errno
import os
import socket


def _sysctl(which: str) -> str:
    """``net.ipv4.tcp_<which>congestion_control`` (``?`` where unknown)."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}congestion_control") as f:
            return f.read().strip()
    except OSError:
        return "?"


def host_default() -> str:
    """This network namespace's default congestion control (``?`` where unknown)."""
    return _sysctl("")


def problem(name: str) -> str | None:
    """Why connections of this process cannot use congestion control ``name`` (None: they
    can), found by setting it on a socket that is never connected."""
    opt = getattr(socket, "TCP_CONGESTION", None)
    if opt is None:
        return "this platform cannot choose a TCP congestion control (Linux only); unset it"
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_TCP, opt, name.encode())
        return None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return (f"this kernel has no congestion control {name!r}: available are "
                    f"{_sysctl('available_')} (net.ipv4.tcp_available_congestion_control; "
                    f"`modprobe tcp_{name}` may add it)")
        if exc.errno == errno.EPERM:
            return (f"{name!r} is not allowed for this user: allowed are "
                    f"{_sysctl('allowed_')}; add it as root with `sysctl -w "
                    f"net.ipv4.tcp_allowed_congestion_control=\"{_sysctl('allowed_')} {name}\"` "
                    f"or choose an allowed one")
        return f"setting it failed: {exc}"
    finally:
        s.close()


def apply(fd: int, name: str, peer: tuple | None = None) -> bool:
    """Set congestion control ``name`` on the TCP connection ``fd`` (a socket the process
    does not own: it is duplicated, set, and the duplicate closed), if its peer is ``peer``
    (``(address, port)``; None: any).  False where ``fd`` is no TCP socket (any more), has
    another peer, or the kernel refused."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        if peer is not None and s.getpeername()[:2] != peer:
            return False
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        return True
    except (OSError, ValueError, TypeError):
        return False
    finally:
        s.close()


def sweep(endpoint: str, name: str) -> int:
    """Set ``name`` on every TCP connection of this process whose peer is ``endpoint``
    (``tcp://host:port``, as ZeroMQ's LAST_ENDPOINT reports it); returns how many.  Covers
    a connection that came up before its socket's monitor was attached."""
    if not endpoint.startswith("tcp://"):
        return 0
    host, _, port = endpoint[6:].rpartition(":")
    host = host.strip("[]")
    try:
        want = (socket.gethostbyname(host) if ":" not in host else host, int(port))
    except (OSError, ValueError):
        return 0
    return sum(apply(fd, name, want) for fd in _socket_fds())


def _socket_fds() -> list[int]:
    out = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for n in names:
        try:
            if os.readlink(f"/proc/self/fd/{n}").startswith("socket:"):
                out.append(int(n))
        except (OSError, ValueError):
            pass
    return out

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
has what was measured.

The setting (:func:`choice`, decided once per process):

* unset: where the host's default is one of :data:`INSTEAD` (bbr), each connection whose
  round trip is shorter than :data:`SHORT_RTT_US` (the handshake's, a network of one
  region) takes the first of its replacements this process may use (cubic, else reno, which
  every kernel allows); a longer path (across regions, where bbr copes better with random
  loss) and every host with another default keep the host's;
* ``host``: every connection keeps the host's default;
* a name: every connection takes it (checked at ``init()``: :func:`problem`).
"""
from __future__ import annotations

import errno
import functools
import os
import socket
import struct
from typing import NamedTuple

#: host defaults that stall parameter-server traffic -> what byteps's short connections take
INSTEAD = {"bbr": ("cubic", "reno")}
#: a connection whose handshake took less than this (microseconds) is within one region
SHORT_RTT_US = 10_000
HOST = "host"


class Choice(NamedTuple):
    """The congestion control byteps's connections get: ``name``, on every connection or
    (``short_only``) on those with a round trip under :data:`SHORT_RTT_US`."""

    name: str
    short_only: bool


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


@functools.lru_cache(maxsize=None)
def choice(setting: str | None) -> Choice | None:
    """What ``BYTEPS_TCP_CONGESTION=setting`` (None: unset) gives this process's
    connections; None: the host's default."""
    if setting == HOST:
        return None
    if setting:
        return Choice(setting, False)
    for name in INSTEAD.get(host_default(), ()):
        if problem(name) is None:
            return Choice(name, True)
    return None


def describe(setting: str | None) -> str:
    """One line for the log: what the connections get, and why."""
    c, host = choice(setting), host_default()
    if c is None:
        return f"TCP congestion control: the host's ({host})"
    if not c.short_only:
        return f"TCP congestion control: {c.name} (BYTEPS_TCP_CONGESTION)"
    return (f"TCP congestion control: {c.name} on connections with a round trip under "
            f"{SHORT_RTT_US // 1000} ms, the host's {host} on longer ones "
            f"(BYTEPS_TCP_CONGESTION=host keeps {host} everywhere)")


def min_rtt_us(s: socket.socket) -> int | None:
    """The smallest round trip the connection ``s`` measured (microseconds; the handshake's
    at first), from TCP_INFO; None where unknown."""
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    except (OSError, AttributeError):
        return None
    # struct tcp_info: tcpi_min_rtt at byte 148 (Linux 4.6+), tcpi_rtt (smoothed) at 68
    off = 148 if len(info) >= 152 else 68
    if len(info) < off + 4:
        return None
    rtt = struct.unpack_from("I", info, off)[0]
    return None if rtt in (0, 0xFFFFFFFF) else rtt


def apply(fd: int, name: str, peer: tuple | None = None, short_only: bool = False) -> bool:
    """Set congestion control ``name`` on the TCP connection ``fd`` (a socket the process
    does not own: it is duplicated, set, and the duplicate closed), if its peer is ``peer``
    (``(address, port)``; None: any) and, with ``short_only``, its round trip is under
    :data:`SHORT_RTT_US`.  False where ``fd`` is no TCP socket (any more), has another peer
    or a long or unknown round trip, or the kernel refused."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        if peer is not None and s.getpeername()[:2] != peer:
            return False
        if short_only and (min_rtt_us(s) or SHORT_RTT_US) >= SHORT_RTT_US:
            return False
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        return True
    except (OSError, ValueError, TypeError):
        return False
    finally:
        s.close()


def sweep(endpoint: str, setting: str | None) -> int:
    """Give every TCP connection of this process whose peer is ``endpoint``
    (``tcp://host:port``, as ZeroMQ's LAST_ENDPOINT reports it) what ``setting`` chooses
    (:func:`choice`); returns how many were set.  Covers a connection that came up before
    its socket's monitor was attached."""
    c = choice(setting)
    if c is None or not endpoint.startswith("tcp://"):
        return 0
    host, _, port = endpoint[6:].rpartition(":")
    host = host.strip("[]")
    try:
        want = (socket.gethostbyname(host) if ":" not in host else host, int(port))
    except (OSError, ValueError):
        return 0
    return sum(apply(fd, c.name, want, c.short_only) for fd in _socket_fds())


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

"""User-space added latency for the emulated cluster (the kernel here has no ``netem``).

    python -m benchmarks.cluster.delay_proxy LINKS.json DELAY_MS [RATE_MBIT]

``LINKS.json`` is a list of links ``{"listen_ns", "ip", "port", "target_ns"}``: in
network namespace ``listen_ns`` a TCP listener on ``ip:port`` (an address made local there
by an AnyIP route, see :func:`anyip_commands`) accepts the client's connection, and the
proxy connects to the same ``ip:port`` inside ``target_ns`` (where the service listens).
Every chunk read from either side is held ``DELAY_MS`` milliseconds before it is written to
the other side (FIFO, per direction), so each link gets DELAY_MS one way (the round trip
grows by twice that).  With RATE_MBIT each direction of each connection also carries at
most that many Mbit/s (the chunks are serialised at that rate before the delay), so a
proxied link is both slow and far (tc's tbf cannot shape it: the proxy hop replaces the
bridge).  Sockets are made in the right namespace with ``setns(2)`` (per
thread); root is needed.  One thread per listener and two per connection.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import select
import socket
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(ns: str) -> None:
    """Move the calling thread into network namespace ``ns`` (a name or a path)."""
    path = ns if ns.startswith("/") else f"/var/run/netns/{ns}"
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_namespace(ns: str, fn):
    """``fn()`` with the calling thread in ``ns``; back to this process's own namespace."""
    home = f"/proc/{os.getpid()}/ns/net"
    _enter(ns)
    try:
        return fn()
    finally:
        _enter(home)


def anyip_commands(ns: str, ips) -> list[list[str]]:
    """Routes that make ``ips`` local in ``ns`` (so that a proxy can listen on them)."""
    return [["ip", "-n", ns, "route", "add", "local", f"{ip}/32", "dev", "lo"] for ip in ips]


def _pump(src: socket.socket, dst: socket.socket, delay: float, stop: threading.Event,
          rate: float | None = None) -> None:
    """Copy ``src`` to ``dst``, each chunk ``delay`` seconds late; with ``rate`` (bytes/s)
    the chunks also leave one after the other at that rate, as over a link of that speed
    (a chunk starts when the link is free, arrives ``delay`` after its last byte)."""
    held: collections.deque = collections.deque()
    free = 0.0                     # when the emulated link has sent what it holds
    open_ = True
    try:
        while open_ or held:
            now = time.monotonic()
            wait = max(0.0, held[0][0] - now) if held else 0.5
            if open_:
                r, _, _ = select.select([src], [], [], wait)
                if r:
                    data = src.recv(1 << 20)
                    if not data:
                        open_ = False
                    else:
                        now = time.monotonic()
                        if rate:
                            free = max(now, free) + len(data) / rate
                            held.append((free + delay, data))
                        else:
                            held.append((now + delay, data))
            elif wait:
                time.sleep(wait)
            now = time.monotonic()
            while held and held[0][0] <= now:
                dst.sendall(held.popleft()[1])
            if stop.is_set():
                return
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(link: dict, delay: float, stop: threading.Event, rate: float | None = None) -> None:
    def make():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((link["ip"], int(link["port"])))
        s.listen(64)
        return s
    lsock = in_namespace(link["listen_ns"], make)
    while not stop.is_set():
        r, _, _ = select.select([lsock], [], [], 0.5)
        if not r:
            continue
        client, _ = lsock.accept()
        try:
            up = in_namespace(link["target_ns"], lambda: socket.create_connection(
                (link["ip"], int(link["port"])), timeout=10))
        except OSError:
            client.close()
            continue
        for s in (client, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(None)
        for a, b in ((client, up), (up, client)):
            threading.Thread(target=_pump, args=(a, b, delay, stop, rate), daemon=True).start()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    links = json.loads(open(argv[0]).read())
    delay = float(argv[1]) / 1000.0
    rate = float(argv[2]) * 1e6 / 8 if len(argv) > 2 else None     # RATE_MBIT, optional
    stop = threading.Event()
    threads = [threading.Thread(target=_serve, args=(lk, delay, stop, rate), daemon=True)
               for lk in links]
    for t in threads:
        t.start()
    print(f"delay proxy: {len(links)} link(s), {delay * 1000:g} ms one way", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A worker's connections to the servers (:class:`ServerLinks`, held by ``Engine``): the
greeting at start, authenticated send/receive with the replay guard, a closed connection
that stays closed fails the job, late partitions are sent again, shared-memory segments
and the credit a partition takes, and keys autotune left behind are freed (``FREE``)."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

import numpy as np

from byteps import transport
from byteps.common.errors import BytePSError
from byteps.common.node import describe, held_tensors
from byteps.core.engine.compression import comp_flags
from byteps.transport import shm
from byteps.transport.frames import SentFrames
from byteps.transport.wire import (DTYPES, MAX_FREE_KEYS, PULL, SHM, Entry, Op, WireError,
                                   decode, encode, new_seq)

log = logging.getLogger("byteps.worker")


# the partition size when every worker and server of the job share this machine
COLOCATED_PARTITION_BYTES = 8 << 20


def colocated_config(cfg, book: dict):
    """``cfg`` with COLOCATED_PARTITION_BYTES partitions when every node in ``book`` is on
    this machine and payloads go through shared memory (BYTEPS_ENABLE_IPC, no explicit
    BYTEPS_PARTITION_BYTES); the same decision on every rank.  A partition then crosses
    no link, and each one costs a wake-up of three processes sharing the cores: loopback
    2 + 2, 100 MB, 57 ms per push_pull with 8 MB against 67 ms with 4 MB."""
    nodes = book.get("servers", []) + book.get("workers", [])
    if not cfg.enable_ipc or cfg.partition_explicit or not book.get("servers") or \
            any(n.get("machine") != shm.machine_id() for n in nodes):
        return cfg
    return dataclasses.replace(cfg, partition_bytes=COLOCATED_PARTITION_BYTES)


class ServerLinks:
    """One connection per server of the address book (``conns[i]`` for ``info[i]``), and
    what this worker knows of each: the last message heard, the last sequence number (replay
    guard), whether its connection is down, the tensors it holds, whether it is colocated
    (shared memory).  Engine thread only (docs/security.md).

    ``link``: the scheduler link (node id, epoch and secret of this worker's messages);
    ``watch``: watch the connections for closing (False with stand-in connections)."""

    def __init__(self, cfg, link, info: list, conns: list, rank: int, drops,
                 watch: bool = True):
        self.cfg, self.link, self.rank, self.drops = cfg, link, rank, drops
        self.info = info
        self.conns = list(conns)
        self.index = {s: i for i, s in enumerate(self.conns)}
        self.heard = [0.0] * len(self.conns)    # last valid message from each server
        self.last_seq = [-1] * len(self.conns)
        self.watches = [transport.ConnWatch(s, cfg.tcp_congestion) for s in self.conns] \
            if watch else []
        self.down: list = [None] * len(self.conns)
        self.held: list[dict] = [{} for _ in self.conns]    # server -> {key: tensor name}
        # colocated servers exchange payloads through shared memory (BYTEPS_ENABLE_IPC)
        self.shm_ok = [cfg.enable_ipc and s.get("machine") == shm.machine_id() for s in info]
        self.push_segs: dict[tuple, shm.Segment] = {}
        self.result_segs: dict[tuple, np.ndarray] = {}
        self.frames = SentFrames()     # pushes' zero-copy frames, kept (transport/frames.py)
        self.seq = new_seq()
        self.resends = 0

    # ---------------------------------------------------------------- messages
    def send(self, i: int, op, body, payload=()) -> None:
        """An authenticated message to server ``i``."""
        self.seq += 1
        transport.send_frames(self.conns[i], encode(self.cfg.job_id, self.link.node_id, op,
                                                    self.link.epoch, self.seq, body,
                                                    self.link.secret) + list(payload))

    def recv(self, sock):
        """(header, payload) of the next message on ``sock``; (None, []) when it is malformed,
        from a wrong sender or replayed."""
        frames = transport.recv_frames(sock)
        try:
            hdr, payload = decode(frames, self.cfg.job_id, self.link.secret)
        except WireError as exc:
            self.drops.warn("malformed message from a server", str(exc))
            return None, []
        i = self.index[sock]
        if hdr.sender != self.info[i]["node_id"] or hdr.seq <= self.last_seq[i]:
            self.drops.warn("message with a wrong sender id or a replayed seq from a server",
                            f"server {self.info[i]['address']}: sender {hdr.sender}, seq "
                            f"{hdr.seq} (last {self.last_seq[i]})")
            return None, []
        self.last_seq[i] = hdr.seq
        return hdr, payload

    def hello(self, dead: set, between: Callable[[float], None]) -> None:
        """Greet every server but the ``dead`` (failed over) until each answers HELLO_OK
        (one may not know the epoch yet).  ``between(now)`` runs between the polls: it
        sends heartbeats and reads the scheduler, whose FAILOVER adds a server that died
        meanwhile to ``dead`` (no longer waited for)."""
        waiting = set(range(len(self.conns))) - dead
        for i in waiting:
            self.send(i, Op.HELLO, {})
        deadline = time.monotonic() + self.cfg.startup_timeout
        pause = 0.02
        again = time.monotonic() + pause
        while waiting:
            between(time.monotonic())
            waiting -= dead
            if time.monotonic() > again:      # the server may not have the new epoch yet
                pause = min(1.0, pause * 2)
                again = time.monotonic() + pause
                for i in waiting:
                    self.send(i, Op.HELLO, {})
            for i in list(waiting):
                if self.conns[i].poll(50):
                    hdr, _ = self.recv(self.conns[i])
                    if hdr is not None and hdr.op == Op.HELLO_OK:
                        waiting.discard(i)
            if time.monotonic() > deadline:
                names = ", ".join(self.info[i]["address"] for i in sorted(waiting))
                raise BytePSError(f"worker rank {self.rank}: server(s) {names} did not answer "
                                  f"within {self.cfg.startup_timeout:g} s")

    # ---------------------------------------------------------------- liveness, resends
    def check(self, now: float, grace: Callable[[int], float | None]) -> None:
        """Fail the job when a server's TCP connection closed and did not come back within
        ``grace(i)`` seconds (None: never, it was failed over)."""
        for i, w in enumerate(self.watches):
            for kind, _, _ in w.poll():
                self.down[i] = (self.down[i] or now) if kind == "down" else None
            down, g = self.down[i], grace(i)
            if down is not None and g is not None and now - down > g:
                s = self.info[i]
                raise BytePSError(
                    f"worker rank {self.rank}: {describe(dict(s, role='server'))} is "
                    f"unreachable: its connection closed {now - down:.1f} s ago and did not come "
                    f"back (did the server process die?); it held {held_tensors(self.held[i])}")

    def resend(self, tasks: Iterable, now: float, send_tasks: Callable[[int, list], None]) -> None:
        """Resend the partitions among ``tasks`` (those in flight) whose answer is late (a
        lost message; the server dedups).

        Unacknowledged pushes are sent again in full (``send_tasks(server, tasks)``);
        acknowledged ones only ask for the result again (a pull without payload).  The wait
        doubles per try (BYTEPS_RESEND_TIMEOUT_S, at most 30 s).
        """
        base = self.cfg.resend_timeout_s
        pushes: dict[int, list] = {}
        pulls: dict[int, list] = {}
        for t in tasks:
            if now - t.sent_at >= min(base * (1 << min(t.tries, 10)), 30.0):
                if not t.acked and now - self.heard[t.server] < base:
                    continue   # the server is answering: a slow link, not a lost push
                t.tries += 1
                (pulls if t.acked else pushes).setdefault(t.server, []).append(t)
        for server, ts in pushes.items():
            self.resends += len(ts)
            send_tasks(server, ts)
        for server, ts in pulls.items():
            self.resends += len(ts)
            flags = PULL | (SHM if self.shm_ok[server] else 0)
            entries = [Entry(t.handle.tensor.key, t.part, t.round, PULL | comp_flags(
                             t.handle.tensor) if t.comp else
                             flags | getattr(t.handle.tensor, "wire_flags", 0),
                             t.handle.tensor.dtype_code, t.length) for t in ts]
            for t in ts:
                t.sent_at = now
            self.send(server, Op.DATA, [entries, []])
        if pushes or pulls:
            log.debug("resent %d push(es) and %d pull(s)", sum(map(len, pushes.values())),
                      sum(map(len, pulls.values())))

    # ---------------------------------------------------------------- shared memory, credit
    def charge(self, t, server: int) -> int:
        """Credit a partition takes: its bytes, or none through shared memory (a colocated
        server: no link to keep from queueing; loopback 2 + 2, 100 MB in 4 MB partitions:
        75 instead of 94 ms per push_pull with no window)."""
        return 0 if self.shm_ok[server] and t.comp is None else t.nbytes

    def push_segment(self, t, server: int) -> np.ndarray | None:
        """This partition's shared-memory segment; None (TCP from now on) if it can't be made."""
        k = (t.handle.tensor.key, t.part)
        seg = self.push_segs.get(k)
        if seg is None:
            try:
                seg = self.push_segs[k] = shm.Segment(
                    shm.push_path(self.cfg.job_id, self.link.node_id, k[0], k[1]), t.nbytes,
                    True)
            except OSError as exc:
                log.warning("worker rank %d: shared memory unavailable, using TCP for server "
                            "%s: %s", self.rank, self.info[server]["address"], exc)
                self.shm_ok[server] = False
                return None
        return seg.array(t.src.dtype, t.length)

    def push_frame(self, t):
        """What to send for partition ``t``'s push over the socket: its source as a
        zero-copy frame kept from the previous step when it is the same buffer (no pyzmq
        garbage-collector wake-up per push; :mod:`byteps.transport.frames`)."""
        return self.frames.get((t.handle.tensor.key, t.part), t.src)

    def result_segment(self, server: int, e: Entry) -> np.ndarray:
        k = (server, e.key, e.part, e.round % 2)
        arr = self.result_segs.get(k)
        if arr is None:
            dt = DTYPES[e.dtype]
            seg = shm.Segment(shm.result_path(self.cfg.job_id, self.info[server]["node_id"],
                                              e.key, e.part, e.round % 2), e.length * dt.itemsize,
                              False)
            arr = self.result_segs[k] = seg.array(dt, e.length)
        return arr

    # ---------------------------------------------------------------- keys, closing
    def free(self, keys: list, dead: set) -> None:
        """Forget this worker's state of ``keys`` (tensors held, shared-memory segments) and
        ask every server but the ``dead`` to free them (``FREE``, at most MAX_FREE_KEYS a
        message)."""
        gone = set(keys)
        for names in self.held:
            for k in keys:
                names.pop(k, None)
        for kp in [kp for kp in self.push_segs if kp[0] in gone]:
            self.push_segs.pop(kp).close()          # unlinks this worker's segment
        for kp in [kp for kp in self.result_segs if kp[1] in gone]:
            del self.result_segs[kp]                # the server's segment: unmapped
        self.frames.forget(lambda kp: kp[0] not in gone)
        for i in range(len(self.conns)):
            if i in dead:
                continue
            for j in range(0, len(keys), MAX_FREE_KEYS):
                self.send(i, Op.FREE, {"keys": keys[j:j + MAX_FREE_KEYS]})
        log.debug("worker rank %d: asked the servers to free %d key(s)", self.rank, len(keys))

    def close(self) -> None:
        for w in self.watches:
            w.close()
        for s in self.conns:
            s.close(0)
        for seg in self.push_segs.values():
            seg.close()
        self.push_segs.clear()
        self.result_segs.clear()
        self.frames.clear()

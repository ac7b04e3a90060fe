"""The engine's dealings with its server connections (:class:`ServersMixin`, a base of
``Engine``): the greeting at start, a closed connection that stays closed fails the job,
late partitions are sent again, and keys autotune left behind are freed (``FREE``)."""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from byteps.common.errors import BytePSError
from byteps.common.node import describe, held_tensors
from byteps.core.engine_comp import comp_flags
from byteps.transport import shm
from byteps.transport.wire import DTYPES, MAX_FREE_KEYS, PULL, SHM, Entry, Op

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


class ServersMixin:
    """Greeting, liveness and resends (docs/security.md), shared-memory segments and the
    credit a partition takes; uses the Engine's state."""

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
                            "%s: %s", self.rank, self.server_info[server]["address"], exc)
                self.shm_ok[server] = False
                return None
        return seg.array(t.src.dtype, t.length)

    def result_segment(self, server: int, e: Entry) -> np.ndarray:
        k = (server, e.key, e.part, e.round % 2)
        arr = self.result_segs.get(k)
        if arr is None:
            dt = DTYPES[e.dtype]
            seg = shm.Segment(shm.result_path(self.cfg.job_id, self.server_info[server]["node_id"],
                                              e.key, e.part, e.round % 2), e.length * dt.itemsize,
                              False)
            arr = self.result_segs[k] = seg.array(dt, e.length)
        return arr

    def hello(self) -> None:
        """Greet every server until each answers HELLO_OK (one may not know the epoch yet)."""
        waiting = set(range(len(self.servers))) - self.failover.dead    # failover: lost ones
        for i in waiting:
            self.send(self.servers[i], Op.HELLO, {})
        deadline = time.monotonic() + self.cfg.startup_timeout
        pause = 0.02
        again = time.monotonic() + pause
        while waiting:
            if time.monotonic() > again:      # the server may not have the new epoch yet
                pause = min(1.0, pause * 2)
                again = time.monotonic() + pause
                for i in waiting:
                    self.send(self.servers[i], Op.HELLO, {})
            for i in list(waiting):
                if self.servers[i].poll(50):
                    hdr, _ = self.recv(self.servers[i])
                    if hdr is not None and hdr.op == Op.HELLO_OK:
                        waiting.discard(i)
            if time.monotonic() > deadline:
                names = ", ".join(self.server_info[i]["address"] for i in sorted(waiting))
                raise BytePSError(f"worker rank {self.rank}: server(s) {names} did not answer "
                                  f"within {self.cfg.startup_timeout:g} s")

    def check_servers(self, now: float) -> None:
        """Fail the job when a server's TCP connection closed and did not come back."""
        for i, w in enumerate(self.server_watch):
            for kind, _, _ in w.poll():
                self.server_down[i] = (self.server_down[i] or now) if kind == "down" else None
            down, grace = self.server_down[i], self.failover.grace(i)
            if down is not None and grace is not None and now - down > grace:
                s = self.server_info[i]
                raise BytePSError(
                    f"worker rank {self.rank}: {describe(dict(s, role='server'))} is "
                    f"unreachable: its connection closed {now - down:.1f} s ago and did not come "
                    f"back (did the server process die?); it held {held_tensors(self.held[i])}")

    def resend_overdue(self, now: float) -> None:
        """Resend partitions whose answer is late (a lost message; the server dedups).

        Unacknowledged pushes are sent again in full; acknowledged ones only ask
        for the result again (a pull without payload).  The wait doubles per try
        (BYTEPS_RESEND_TIMEOUT_S, at most 30 s).
        """
        base = self.cfg.resend_timeout_s
        pushes: dict[int, list] = {}
        pulls: dict[int, list] = {}
        for t in self.inflight.values():
            if now - t.sent_at >= min(base * (1 << min(t.tries, 10)), 30.0):
                if not t.acked and now - self.heard[t.server] < base:
                    continue   # the server is answering: a slow link, not a lost push
                t.tries += 1
                (pulls if t.acked else pushes).setdefault(t.server, []).append(t)
        for server, ts in pushes.items():
            self.resends += len(ts)
            self.send_tasks(server, ts)
        for server, ts in pulls.items():
            self.resends += len(ts)
            flags = PULL | (SHM if self.shm_ok[server] else 0)
            entries = [Entry(t.handle.tensor.key, t.part, t.round, PULL | comp_flags(
                             t.handle.tensor) if t.comp else
                             flags | getattr(t.handle.tensor, "wire_flags", 0),
                             t.handle.tensor.dtype_code, t.length) for t in ts]
            for t in ts:
                t.sent_at = now
            self.send(self.servers[server], Op.DATA, [entries, []])
        if pushes or pulls:
            log.debug("resent %d push(es) and %d pull(s)", sum(map(len, pushes.values())),
                      sum(map(len, pulls.values())))

    def retire_keys(self, keys: list, again) -> None:
        """Engine thread: forget this worker's state of ``keys`` (keys autotune left behind,
        byteps/core/retire.py: declarations sent, shared-memory segments) and ask every live
        server to free them (``FREE``, at most MAX_FREE_KEYS a message).  A key that still
        has a partition queued or in flight is handed back to ``again`` (retried at a later
        step boundary), never freed."""
        busy = {t.handle.tensor.key for t in self.inflight.values()} | \
            {t.handle.tensor.key for t in self.heap}
        later = [k for k in keys if k in busy]
        keys = [k for k in keys if k not in busy]
        if later:
            again(later)
        if not keys:
            return
        gone = set(keys)
        self.declared = {d for d in self.declared if d[0] not in gone}
        for names in self.held:
            for k in keys:
                names.pop(k, None)
        for kp in [kp for kp in self.push_segs if kp[0] in gone]:
            self.push_segs.pop(kp).close()          # unlinks this worker's segment
        for kp in [kp for kp in self.result_segs if kp[1] in gone]:
            del self.result_segs[kp]                # the server's segment: unmapped
        for i, sock in enumerate(self.servers):
            if i in self.failover.dead:
                continue
            for j in range(0, len(keys), MAX_FREE_KEYS):
                self.send(sock, Op.FREE, {"keys": keys[j:j + MAX_FREE_KEYS]})
        log.debug("worker rank %d: asked the servers to free %d key(s)", self.rank, len(keys))

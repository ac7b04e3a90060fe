"""Worker-to-worker messages for the decentralized algorithms (docs/algorithms.md).

Every distributed worker listens on one ROUTER socket (``tcp://DMLC_NODE_HOST:PORT``,
``BYTEPS_PEER_PORT``, default any free port; none with ``BYTEPS_ENABLE_PEERS=0``) and
registers its address with the scheduler, which hands it out in the address book
(``workers[i]["address"]``).  A worker that talks to a
peer connects a DEALER to that address.

A peer message is ``[header, mac, payload]`` in the wire format of every other frame
(:mod:`byteps.transport.wire`, op ``PEER``): the header is MAC'd under
``BYTEPS_JOB_SECRET``, carries the membership epoch and a per-stream sequence number
(replays are dropped), and its body is validated field by field::

    {"tag": step >= 0, "slot": int >= 0, "kind": 0..15, "nbytes": payload bytes,
     "layout": 63-bit fingerprint of the sender's parameter names and shapes}

The sender is the header's node id, which must be a worker of the address book other
than this one (a ZeroMQ identity is never trusted).  Nothing received is unpickled.

Sockets are used by one thread at a time (a lock): the thread that runs the algorithm.
While it waits for a peer it watches the peer's connection and the engine: a peer whose
connection closed and did not come back, or a job failure the scheduler announced
(``NODE_DEAD``), ends the wait with a :class:`BytePSError` naming the peer.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import zmq

from byteps import transport
from byteps.core.node import BytePSError, describe, down_grace
from byteps.transport.wire import Op, WireError, decode, encode, new_seq

log = logging.getLogger("byteps.peers")

MAX_SLOT = 1 << 31
MAX_KINDS = 16
MAX_BUFFERED = 4096        # messages from peers that are ahead, before they are dropped
KIND_JOINED = MAX_KINDS - 1   # "this rank called join()" (tag: the join generation)
KIND_LEFT = MAX_KINDS - 2     # "this rank left the membership" (payload: why, utf-8)


def listen(cfg, ctx: zmq.Context):
    """The peer socket of a worker: (socket, address), or (None, None) when disabled."""
    if not cfg.enable_peers:
        return None, None
    return transport.listen(ctx, f"tcp://{cfg.node_host}:{cfg.peer_port}", cfg.max_msg_bytes)


def check_body(body: dict) -> tuple[int, int, int, int, int]:
    """(tag, slot, kind, nbytes, layout) of a PEER body; raises WireError."""
    if set(body) != {"tag", "slot", "kind", "nbytes", "layout"}:
        raise WireError(f"peer body fields {sorted(body)[:8]}, expected tag, slot, kind, "
                        f"nbytes, layout")
    vals = []
    for name, hi in (("tag", 1 << 62), ("slot", MAX_SLOT), ("kind", MAX_KINDS),
                     ("nbytes", 1 << 40), ("layout", 1 << 63)):
        v = body[name]
        if type(v) is not int or not 0 <= v < hi:
            raise WireError(f"peer body field {name!r} must be an integer in [0, {hi}), "
                            f"got {v!r}")
        vals.append(v)
    return tuple(vals)


class PeerNet:
    """This worker's connections to the other workers (one per process)."""

    def __init__(self, cfg, ctx: zmq.Context, sock, address: str, secret: bytes | None):
        self.cfg, self.ctx, self.sock, self.address = cfg, ctx, sock, address
        self.secret = secret
        self.lock = threading.Lock()
        self.out: dict[int, zmq.Socket] = {}          # rank -> DEALER
        self.watch: dict[int, transport.ConnWatch] = {}
        self.down: dict[int, float | None] = {}
        self.inbox: dict[tuple, tuple] = {}           # (rank, tag, slot) -> (kind, layout, frame)
        self.seqs = transport.SeqTracker()
        self.seq = new_seq()
        self.drops = transport.RateLimitedLog(log)
        self.rank, self.node_id, self.epoch = -1, -1, 0
        self.workers: dict[int, dict] = {}
        self.by_node: dict[int, int] = {}
        self.fatal = lambda: None                     # the engine's failure, if any
        self.closed = False
        self.slots = 0
        self.joined: set[int] = set()                 # peers that called join() (this round)
        self.left: dict[int, tuple] = {}              # peers that left: (why, when)
        self.leaving: str | None = None               # this rank leaves: waits end
        self.linger_ms = 0
        self.join_gen = 0                             # join() rounds completed

    def new_slot(self) -> int:
        """A message slot for one algorithm instance (every rank creates its instances in
        the same order, so the numbers agree)."""
        with self.lock:
            self.slots += 1
            return self.slots - 1

    def keep_slot(self, slot: int) -> int:
        """An algorithm instance of an earlier group keeps its slot in this one (an elastic
        re-form: a newcomer creates its instances in the same order, so numbers agree)."""
        with self.lock:
            self.slots = max(self.slots, slot + 1)
            return slot

    def attach(self, book: dict, node_id: int, epoch: int, fatal) -> None:
        """Take the address book of the formed job (workers with their addresses)."""
        self.rank, self.node_id, self.epoch, self.fatal = book["rank"], node_id, epoch, fatal
        for w in book.get("workers") or []:
            if not isinstance(w, dict) or type(w.get("rank")) is not int \
                    or type(w.get("node_id")) is not int:
                raise WireError("address book: a worker entry without rank/node_id")
            self.workers[w["rank"]] = w
            self.by_node[w["node_id"]] = w["rank"]

    # ------------------------------------------------------------------ join()
    def announce_join(self) -> None:
        """This rank called join(): tell every peer it talks to (after everything it sent
        them, on the same connections), so that they treat it as absent instead of
        waiting for it."""
        with self.lock:
            ranks = list(self.out)
        for r in ranks:
            self.send(r, self.join_gen, 0, KIND_JOINED, 0, np.zeros(0, np.uint8))

    def announce_leave(self, why: str, ranks) -> None:
        """This rank leaves the membership (shutdown()): tell ``ranks`` and every peer it
        talks to, so that their waits for it fail at once naming it, and end this rank's
        own waits.  A wait of another thread holds the lock while it polls the inbound
        socket only, so the outbound ones are used without it when it is held."""
        self.leaving = why
        msg = np.frombuffer(why.encode("utf-8", "replace")[:1000], np.uint8)
        held = self.lock.acquire(timeout=0.5)
        try:
            for r in sorted(set(ranks) | set(self.out)):
                if r == self.rank or r not in self.workers:
                    continue
                s = self.out.get(r) if not held else self._dealer(r)
                if s is None:
                    continue
                self.seq += 1
                hdr = encode(self.cfg.job_id, self.node_id, Op.PEER, self.epoch, self.seq,
                             {"tag": 0, "slot": 0, "kind": KIND_LEFT, "nbytes": msg.nbytes,
                              "layout": 0}, self.secret)
                s.send_multipart(hdr + [memoryview(msg)], copy=False)
            self.linger_ms = 300            # close() lets these go out (a gone peer: 0.3 s)
        finally:
            if held:
                self.lock.release()

    def join_done(self) -> None:
        """Every rank has joined: peers are present again (a later JOINED message of the
        finished round is ignored by its generation)."""
        with self.lock:
            self.join_gen += 1
            self.joined.clear()

    def describe(self, rank: int) -> str:
        w = self.workers.get(rank) or {"rank": rank}
        at = f" at {w['address']}" if isinstance(w.get("address"), str) else ""
        return describe(dict(w, role="worker")) + at

    # ------------------------------------------------------------------ sockets
    def _dealer(self, rank: int) -> zmq.Socket:
        s = self.out.get(rank)
        if s is not None:
            return s
        w = self.workers.get(rank)
        addr = w.get("address") if w else None
        if not isinstance(addr, str) or not addr.startswith("tcp://") or len(addr) > 300:
            raise BytePSError(
                f"worker rank {self.rank}: no peer address for {self.describe(rank)} in the "
                f"address book; every worker must run with BYTEPS_ENABLE_PEERS=1 (the "
                f"default) for decentralized algorithms")
        s = transport.connect(self.ctx, addr, f"p{self.rank}/".encode() + new_seq().to_bytes(
            8, "little"))
        self.out[rank] = s
        self.watch[rank] = transport.ConnWatch(s, self.cfg.tcp_congestion)
        self.down[rank] = None
        return s

    def connect(self, ranks) -> None:
        """Open the connections to ``ranks`` (so that their death is noticed)."""
        with self.lock:
            for r in ranks:
                if r != self.rank:
                    self._dealer(r)

    def send(self, rank: int, tag: int, slot: int, kind: int, layout: int,
             payload: np.ndarray) -> None:
        """Send ``payload`` (any contiguous array; kept alive by ZeroMQ) to ``rank``."""
        if rank == self.rank or rank not in self.workers:
            raise BytePSError(f"worker rank {self.rank}: cannot send to peer rank {rank} "
                              f"(job of {len(self.workers)} workers)")
        buf = np.ascontiguousarray(payload)
        with self.lock:
            s = self._dealer(rank)
            self.seq += 1
            hdr = encode(self.cfg.job_id, self.node_id, Op.PEER, self.epoch, self.seq,
                         {"tag": tag, "slot": slot, "kind": kind, "nbytes": buf.nbytes,
                          "layout": layout}, self.secret)
            s.send_multipart(hdr + [memoryview(buf.reshape(-1).view(np.uint8))], copy=False)

    def recv(self, rank: int, tag: int, slot: int, kind: int, layout: int, nbytes: int,
             what: str, absent_ok: bool = False) -> memoryview | None:
        """Wait for the message (``rank``, ``tag``, ``slot``); its payload's bytes.  With
        ``absent_ok``, None when ``rank`` called join() without sending it (its messages
        arrive before its JOINED, so every receiver decides alike).

        Raises BytePSError naming the peer when it died, when the job failed, or when
        its message does not match (kind, layout fingerprint, size)."""
        started = time.monotonic()
        warned = False
        with self.lock:
            self._dealer(rank)
            while True:
                got = self.inbox.pop((rank, tag, slot), None)
                if got is not None:
                    k, lay, frame = got
                    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
                    if k != kind or lay != layout or buf.nbytes != nbytes:
                        raise BytePSError(
                            f"worker rank {self.rank}: {what}: {self.describe(rank)} sent "
                            f"kind {k}, layout {lay:#x}, {buf.nbytes} bytes; this rank "
                            f"expected kind {kind}, layout {layout:#x}, {nbytes} bytes: "
                            f"every worker must train the same parameters (names, shapes, "
                            f"dtypes) with the same algorithm")
                    return buf
                if absent_ok and rank in self.joined:
                    return None
                if self.leaving is not None:
                    raise BytePSError(f"worker rank {self.rank}: {what}: this rank left the "
                                      f"job's current membership ({self.leaving})")
                now = time.monotonic()
                err = self.fatal()
                if err is not None:
                    raise BytePSError(f"worker rank {self.rank}: {what}: {err}")
                if rank in self.left and self._left_final(rank, now):
                    raise BytePSError(
                        f"worker rank {self.rank}: {what}: {self.describe(rank)} left the "
                        f"job's current membership ({self.left[rank][0]}); every rank calls "
                        f"shutdown() and init() to go on")
                self._check_peer(rank, now, what)
                if not warned and now - started > self.cfg.stall_warning_s:
                    warned = True
                    log.warning("worker rank %d: %s: waiting %.0f s for %s (it has not "
                                "called join())", self.rank, what, now - started,
                                self.describe(rank))
                if self.sock.poll(100):
                    self._read()

    def _left_final(self, rank: int, now: float) -> bool:
        """Whether ``rank``'s departure fails a wait for it now: at once, but in an elastic
        job only after the heartbeat timeout (the scheduler's re-form, WorkersChanged,
        must win the race, as for a closed connection in :meth:`_check_peer`)."""
        if not os.environ.get("BYTEPS_MIN_WORKERS"):
            return True
        return now - self.left[rank][1] > self.cfg.heartbeat_timeout

    def _check_peer(self, rank: int, now: float, what: str) -> None:
        for r, w in self.watch.items():
            for ev, _, _ in w.poll():
                self.down[r] = (self.down[r] or now) if ev == "down" else None
        since = self.down.get(rank)
        grace = down_grace(self.cfg)
        if os.environ.get("BYTEPS_MIN_WORKERS"):
            # elastic: the scheduler notices the same closed connection and re-forms the
            # group; its interruption (fatal()) must win the race against this error
            grace += self.cfg.heartbeat_timeout
        if since is not None and now - since > grace:
            raise BytePSError(
                f"worker rank {self.rank}: {what}: peer {self.describe(rank)} is unreachable: "
                f"its connection closed {now - since:.1f} s ago and did not come back (did "
                f"the worker process die?); decentralized training cannot continue")

    def _read(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 4:       # routing id, header, mac, one payload
                self.drops.warn("peer message", f"{len(frames)} frames, expected 4")
                continue
            try:
                hdr, payload = decode(frames[1:], self.cfg.job_id, self.secret)
                if hdr.op != Op.PEER:
                    raise WireError(f"op {hdr.op} on the peer socket")
                tag, slot, kind, nbytes, layout = check_body(hdr.body)
            except WireError as exc:
                self.drops.warn("peer message", str(exc))
                continue
            rank = self.by_node.get(hdr.sender)
            if rank is None or rank == self.rank:
                self.drops.warn("peer message", f"sender {hdr.sender} is not a peer worker")
                continue
            if hdr.epoch != self.epoch:
                self.drops.warn("peer message", f"epoch {hdr.epoch} (current {self.epoch})")
                continue
            if len(payload[0]) != nbytes:
                self.drops.warn("peer message", f"payload of {len(payload[0])} bytes, header "
                                f"says {nbytes}")
                continue
            if not self.seqs.accept(rank, hdr.seq):
                self.drops.warn("peer message", f"replayed seq {hdr.seq} from rank {rank}")
                continue
            if kind == KIND_JOINED:
                if tag >= self.join_gen:
                    self.joined.add(rank)
                continue
            if kind == KIND_LEFT:
                self.left.setdefault(rank, (payload[0].bytes[:1000].decode("utf-8", "replace"),
                                            time.monotonic()))
                continue
            if len(self.inbox) >= MAX_BUFFERED:
                self.drops.warn("peer message", f"more than {MAX_BUFFERED} buffered")
                continue
            self.inbox[(rank, tag, slot)] = (kind, layout, payload[0])

    def close(self) -> None:
        if self.leaving is None:
            self.leaving = "it called shutdown()"      # a wait of another thread ends
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for w in self.watch.values():
                w.close()
            for s in self.out.values():
                s.close(self.linger_ms)
            self.sock.close(0)

"""The CPU summation server.

One I/O thread owns the ROUTER socket.  Small partitions are summed inline
(a thread hand-off costs more than the add); large ones go to engine
threads (``BYTEPS_SERVER_ENGINE_THREAD``), keys spread over threads by bytes
— numpy releases the GIL on large adds, so threads sum in parallel (none on a host
with at most two CPUs: :func:`byteps.server.decls.engine_threads`).
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time

import numpy as np
import zmq

from byteps import transport
from byteps.transport import shm
from byteps.common import malloc
from byteps.common.config import Config
from byteps.common.node import (PEER_FAILED_EXIT, BytePSError, SchedulerLink, describe,
                                failure_exit_code)
from byteps.compression import CompressionError
from byteps.server.decls import INLINE_BYTES, Tensors, engine_threads  # noqa: F401
from byteps.server.metrics import serve_server
from byteps.server.records import Records
from byteps.server.replica import Replicator
from byteps.server.replies import Replies
from byteps.server.retire import KeyRetirement
from byteps.server.staleness import AsyncStore
from byteps.server.stalls import StallReports
from byteps.server.store import Slot, apply, async_groups, counted_joined, recheck
from byteps.server.tree import leaf_positions
from byteps.transport.wire import (ACK, ASYNC, COMP, DTYPES, NONFINITE, PUSH, SHM, Entry, Op,
                                   WireError, decode, entry_array, frame_bytes, payload_count)

log = logging.getLogger("byteps.server")
# heartbeats, connection and backup checks run at most this often (seconds), not after
# every message: each reads a monitor socket (a syscall); 256 KB partitions arrive every
# few hundred microseconds
TICK_S = 0.01


class Server:
    """One server process.  Its concepts are parts it keeps: ``tensors`` (declarations,
    slots, checks: decls.py), ``stalls`` (stall reports: stalls.py), ``records`` (byte
    counts, test records: records.py), ``retire`` (FREE: retire.py), ``replies``,
    ``replica`` and ``async_store``."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        malloc.tune(cfg.malloc_tune)        # receive buffers stay in the heap
        self.secret = cfg.job_secret.encode() if cfg.job_secret else None
        self.ctx = zmq.Context()
        self.sock, self.address = transport.listen(
            self.ctx, f"tcp://{cfg.node_host}:{cfg.server_port}", cfg.max_msg_bytes)
        self.link = SchedulerLink(cfg, self.ctx, "server")
        self.drops = transport.RateLimitedLog(log)
        self.peers: dict[bytes, dict] = {}    # worker identity -> book entry
        # declarations and slots (decls.py); the same dicts under the names the hot path
        # and the other server modules read
        self.tensors = Tensors(self.drops, self.peers, self.send, engine_threads(cfg),
                               cfg.enable_async)
        self.slots: dict[tuple, Slot] = self.tensors.slots
        self.decls: dict[int, dict] = self.tensors.decls      # tensor key -> declaration / error
        self.workers_by_id: dict[int, dict] = {}
        self.nworkers = self.size = 0
        self.seqs = transport.SeqTracker()    # replay guard per worker node id
        self.watch = transport.ConnWatch(self.sock, cfg.tcp_congestion)
        self.peer_fds: dict[int, dict] = {}
        self.dropper = transport.Dropper(0.0, 0)
        self.replies = Replies(self)          # every message to a worker (replies.py)
        self.queues = [queue.SimpleQueue() for _ in self.tensors.engine_load]
        self.lock = threading.Lock()       # guards slots/decls across engine threads
        self.exit_code = None
        self.records = Records(self)       # byte counts, BYTEPS_TEST_RECORD (records.py)
        self.stalls = StallReports(self)   # rounds waiting too long (stalls.py)
        self.local_reduce = "off"
        self.push_maps: dict[tuple, np.ndarray] = {}
        # membership within an epoch (the scheduler's MEMBERS): ranks that called join()
        # count as pushing zeros; ranks gone (shutdown() or exit 0) fail rounds they miss
        self.joined = self.joined_ranks = frozenset()   # as counted (store) / as told
        self.gone: dict[int, str] = {}
        self.pushers: set = set()
        self.leaves: dict = {}          # rank -> position in the reduction tree (tree.py)
        self.async_store = AsyncStore(cfg.async_staleness)   # ASYNC entries (staleness.py)
        self.replica = Replicator(self)    # BYTEPS_SERVER_REPLICAS: backup, failover
        self.retire = KeyRetirement(self)  # FREE: keys every worker is done with (retire.py)

    # ---------------------------------------------------------------- set-up
    def start(self) -> None:
        body = self.link.register({"address": self.address}, "server")
        self.dropper = transport.Dropper(self.cfg.test_drop_rate, 7919 * self.link.node_id)
        self.load_book(body)
        serve_server(self, next((i for i, s in enumerate(body.get("servers") or [])
                                 if s.get("node_id") == self.link.node_id), 0))
        for i, q in enumerate(self.queues):
            threading.Thread(target=self.engine, args=(q,), name=f"bps-engine-{i}",
                             daemon=True).start()

    def load_book(self, body: dict) -> None:
        workers = body.get("workers")
        if not isinstance(workers, list):
            raise WireError("address book without workers")
        self.workers_by_id = {w["node_id"]: w for w in workers}
        self.nworkers = self.size = len(workers)
        pc = body.get("push_count")     # local reduction: one push per host and key
        if type(pc) is int and 1 <= pc <= len(workers):
            self.nworkers = pc
        self.local_reduce = body.get("local_reduce", "off")
        self.leaves = leaf_positions(workers, self.local_reduce)   # the sum's fixed order
        pushers = body.get("pushers")
        self.pushers = set(pushers if isinstance(pushers, list) else (w["rank"] for w in workers))
        self.joined, self.joined_ranks, self.gone = frozenset(), frozenset(), {}
        self.retire.new_book()          # ranks of the new book vote again
        self.peers.clear()
        self.seqs.forget()
        for s in self.slots.values():
            s.reset_rounds()
        # workers of a new epoch create new push segments (the old files are unlinked)
        self.push_maps.clear()
        self.replica.load_book(body)
        log.info("server %s ready: %d worker(s), epoch %d; %s", self.address, self.nworkers,
                 self.link.epoch, transport.congestion.describe(self.cfg.tcp_congestion))

    # ---------------------------------------------------------------- loop
    def run(self) -> int:
        try:
            self.start()
        except BytePSError as exc:
            log.error("%s", exc)
            return failure_exit_code()     # PEER_FAILED_EXIT: the job ended before it formed
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.link.sock, zmq.POLLIN)
        poller.register(self.replies.wake_r, zmq.POLLIN)
        self.replica.watch(poller)
        next_scan = time.monotonic() + 1.0
        next_tick = 0.0
        try:
            while self.exit_code is None:
                for sock, _ in poller.poll(200):
                    if sock is self.sock:
                        with self.replies.burst():    # one reply message per worker
                            for _ in range(64):
                                frames = transport.recv_frames(self.sock, block=False)
                                if frames is None:
                                    break
                                self.on_worker(frames)
                    elif sock is self.link.sock:
                        self.on_scheduler()
                    elif sock is self.replica.sock:
                        self.replica.on_backup_reply()
                    else:
                        self.replies.woken()
                self.replies.flush()
                now = time.monotonic()
                if now < next_tick:        # not after every message: each check is a syscall
                    continue
                next_tick = now + TICK_S
                try:
                    self.link.tick(now)
                except BytePSError as exc:
                    log.error("%s", exc)
                    return 1
                self.check_connections()
                self.replica.tick(now)
                if now >= next_scan:
                    next_scan = now + 1.0
                    self.stalls.scan(now)
            return self.exit_code
        finally:
            self.records.report()
            self.watch.close()
            self.sock.close(0)
            self.link.close()
            self.replica.close()
            for slot in self.slots.values():
                for seg in slot.segs or ():
                    seg.close()
            self.push_maps.clear()

    def shm_push(self, w: dict, e: Entry):
        """The array a colocated worker left in its shared-memory segment."""
        if not self.cfg.enable_ipc or w.get("machine") != shm.machine_id():
            raise WireError(f"shared-memory push from rank {w['rank']}, which is not colocated")
        k = (w["node_id"], e.key, e.part)
        arr = self.push_maps.get(k)
        if arr is None or arr.size != e.length or arr.dtype != DTYPES[e.dtype]:
            try:
                seg = shm.Segment(shm.push_path(self.cfg.job_id, w["node_id"], e.key, e.part),
                                  e.length * DTYPES[e.dtype].itemsize, False)
            except (OSError, ValueError) as exc:
                raise WireError(f"shared-memory push from rank {w['rank']}: {exc}") from None
            arr = self.push_maps[k] = seg.array(DTYPES[e.dtype], e.length)
        return arr

    def on_scheduler(self) -> None:
        hdr = self.link.recv()
        if hdr is None:
            return
        if hdr.op == Op.REGISTER_OK:          # workers re-formed the group
            self.link.epoch = hdr.epoch
            with self.lock:
                self.load_book(hdr.body)
        elif hdr.op == Op.TERMINATE:
            ok = hdr.body.get("ok") is True
            (log.info if ok else log.error)("job ended: %s", hdr.body.get("reason"))
            self.exit_code = 0 if ok else PEER_FAILED_EXIT
        elif hdr.op == Op.NODE_DEAD:
            # (the scheduler said it at ERROR; a second copy here is noise)
            log.info("job failed: %s", hdr.body.get("reason"))
            self.exit_code = PEER_FAILED_EXIT
        elif hdr.op == Op.MEMBERS:
            self.on_members(hdr.body)
        elif hdr.op == Op.FAILOVER:
            self.replica.on_failover(hdr.body)

    def on_members(self, body: dict) -> None:
        """Joined ranks, ranks gone and round resets from the scheduler (join(), shutdown(),
        exit 0 within an epoch; docs/fault_tolerance.md)."""
        joined, gone = body.get("joined", []), body.get("gone", [])
        if not (isinstance(joined, list) and all(type(r) is int for r in joined)
                and isinstance(gone, list) and all(
                    isinstance(g, list) and len(g) == 2 and type(g[0]) is int
                    and isinstance(g[1], str) for g in gone)):
            return self.drops.warn("bad MEMBERS", repr(body)[:200])
        if body.get("reset") is True:
            # every worker joined and synchronized everything: the next rounds start at 0
            with self.lock:
                for slot in self.slots.values():
                    slot.reset_rounds()
                self.replica.reset()
            self.joined = self.joined_ranks = frozenset()
        else:
            self.joined_ranks, self.joined = frozenset(joined), counted_joined(
                joined, self.workers_by_id.values(), self.local_reduce)
        self.gone.update((r, text[:1000]) for r, text in gone)
        if self.joined or self.gone:
            for slot in list(self.slots.values()):
                if slot.engine < 0:
                    self.recheck(slot)
                else:
                    self.queues[slot.engine].put((slot, None, None, -1, None))
        self.link.send(Op.MEMBERS_OK, {"id": body.get("id")})

    def recheck(self, slot: Slot) -> None:
        """After a membership change: finish the rounds that only joined ranks were missing
        from, and fail the pulls of rounds that a gone rank never pushed."""
        out: dict = {}
        if recheck(slot, self.nworkers, self.joined, out):
            log.debug("joined rank(s) %s: finished waiting rounds of key %d part %d (%s)",
                      sorted(self.joined), slot.key, slot.part,
                      "engine thread" if slot.engine >= 0 else "inline")
        for rnd, rs in list(slot.rounds.items()):
            if rs.result is None and rs.waiting:
                why = self.blocked(slot, rnd)
                if why:
                    for ident, _, _ in rs.waiting:
                        self.round_error(ident, slot.key, why, gone=True)
                    rs.waiting.clear()
        self.async_store.release(slot, self.async_ranks(), out)   # a slow rank left/joined
        if out:
            self.replies.queue(out)

    def blocked(self, slot: Slot, rnd: int) -> str | None:
        """Why round ``rnd`` of ``slot`` can never complete (a pusher left the job without
        pushing it and without join()), or None."""
        if not self.gone:
            return None
        rs = slot.rounds.get(rnd)
        if rs is not None and rs.result is not None:
            return None
        for r, text in sorted(self.gone.items()):
            if r in self.pushers and r not in self.joined and (rs is None or r not in rs.ranks):
                name = self.decls.get(slot.key, {}).get("name", slot.key)
                return (f"push_pull of tensor {name!r} (round {rnd}) cannot complete: {text} "
                        f"without pushing it and without calling join(); when ranks have "
                        f"different amounts of data, call bps.join() on each rank that runs "
                        f"out (the others go on with zeros from it), or give every rank the "
                        f"same number of steps")
        return None

    def round_error(self, ident: bytes, key: int, message: str, gone: bool = False) -> None:
        """Fail one worker's push_pulls of ``key`` (a round that cannot complete); sent by
        the I/O thread (this may run on an engine thread).  ``gone``: because a rank left
        this membership (the worker's next init() forms the group anew)."""
        name = self.decls.get(key, {}).get("name", "")
        self.replies.error(ident, {"key": key, "name": name, "message": message,
                                   **({"gone": True} if gone else {})})

    def on_worker(self, frames: list) -> None:
        ident = frames[0].bytes
        try:
            hdr, payload = decode(frames[1:], self.cfg.job_id, self.secret)
        except WireError as exc:
            return self.drops.warn("malformed message", str(exc))
        if hdr.sender in self.replica.server_ids:      # a server replicating to us
            return self.replica.on_peer(ident, hdr, payload, frames)
        if hdr.op == Op.HELLO:
            self.replica.crash_on_hello()         # BYTEPS_TEST_SERVER_CRASH=I:-1 (tests)
            w = self.workers_by_id.get(hdr.sender)
            if hdr.epoch > self.link.epoch:     # re-init: the server's new book is on its way
                return log.debug("HELLO of epoch %d before this server's book", hdr.epoch)
            if w is None or hdr.epoch != self.link.epoch:
                return self.drops.warn("HELLO from a node id the scheduler did not assign (or "
                                       "of a stale epoch)", f"sender {hdr.sender}, epoch "
                                       f"{hdr.epoch}")
            other = next((i for i, p in self.peers.items() if p is w and i != ident), None)
            if other is not None or not self.seqs.accept(hdr.sender, hdr.seq):
                return self.drops.warn("HELLO for a node id bound to another connection, or "
                                       "replayed", f"sender {hdr.sender}, seq {hdr.seq}")
            self.peers[ident] = w
            self.remember_connection(frames[1], w)
            return self.send(ident, Op.HELLO_OK, {})
        w = self.peers.get(ident)
        if w is None or w["node_id"] != hdr.sender:
            return self.drops.warn("message from unregistered peer", f"sender {hdr.sender}")
        if hdr.epoch != self.link.epoch:
            return self.drops.warn("message from a stale epoch", f"{hdr.epoch}")
        if not self.seqs.accept(hdr.sender, hdr.seq):
            return self.drops.warn("replayed message", f"sender {hdr.sender}, seq {hdr.seq}")
        if hdr.op == Op.FREE:                        # keys autotune left behind
            return self.retire.on_free(w, hdr.body)
        if hdr.op != Op.DATA:
            return self.drops.warn("unexpected op", Op(hdr.op).name)
        self.records.wire_received += sum(len(f) for f in frames[1:])
        if self.dropper.drop():                      # BYTEPS_TEST_DROP_RATE
            return
        entries, decls = hdr.body
        if payload_count(entries, Op.DATA) != len(payload):
            return self.drops.warn("message with wrong payload count",
                                   f"{len(payload)} frames for {len(entries)} entries")
        entries = [Entry._make(e) for e in entries]     # validated by decode: 6 integers
        frames = iter(payload)
        try:
            arrays = [None if not e.flags & PUSH else self.shm_push(w, e) if e.flags & SHM
                      else frame_bytes(next(frames)) if e.flags & COMP
                      else entry_array(e, next(frames)) for e in entries]
        except WireError as exc:
            if not any(e.flags & SHM for e in entries):
                return self.drops.warn("truncated payload", str(exc))
            for e in entries:        # a segment that cannot be mapped: the pushes fail, loudly
                self.round_error(ident, e.key, f"{exc}; set BYTEPS_ENABLE_IPC=0 to push "
                                 f"over the socket instead")
            return
        self.on_data(ident, w, entries, decls, arrays)

    def remember_connection(self, frame, who: dict) -> None:
        """``who`` owns the connection ``frame`` came on: its close is logged by name.  The
        monitor's events are read first: a closed connection's descriptor may already be
        this one's, and its late "down" would otherwise be taken for this one's."""
        self.check_connections()
        self.peer_fds[transport.source_fd(frame)] = who

    def check_connections(self) -> None:
        """Log closed connections: a worker's, or a stranger's (oversize/malformed stream)."""
        for kind, fd, peer in self.watch.poll():
            if kind != "down":
                continue
            w = self.peer_fds.pop(fd, None)
            if w is not None:
                log.info("connection of %s closed", describe(w))
            else:
                self.drops.warn("connection", f"from {peer} closed (the peer left, or ZeroMQ "
                                f"dropped it for a frame over BYTEPS_MAX_MSG_BYTES="
                                f"{self.cfg.max_msg_bytes} or a malformed stream)")

    def on_data(self, ident, w, entries, decls, arrays) -> None:
        rank = w["rank"]
        for d in decls:
            self.tensors.declare(d, w)
        out: dict = {}
        for e, arr in zip(entries, arrays):
            err = self.decls.get(e.key, {}).get("error")
            if err or e.key not in self.decls:
                self.tensors.key_error(e.key, err or f"partition key {e.key} pushed by rank "
                                       f"{rank} without a declaration")
                continue
            slot = self.slots.get((e.key, e.part))
            if slot is None:
                slot = self.tensors.new_slot(e, rank)
                if slot is None:
                    continue
            elif slot.dtype != e.dtype or slot.length != e.length:
                self.tensors.key_error(e.key, self.tensors.mismatch(e, slot, rank))
                continue
            if arr is not None and not self.tensors.comp_ok(slot, e, arr, rank):
                continue
            why = self.blocked(slot, e.round) if self.gone and not e.flags & ASYNC else None
            if why:
                self.round_error(ident, e.key, why, gone=True)
                continue
            if e.flags & SHM and slot.segs is None and not slot.rounds:
                try:
                    segs = [shm.Segment(shm.result_path(self.cfg.job_id, self.link.node_id,
                                                        e.key, e.part, p),
                                        e.length * DTYPES[e.dtype].itemsize, True)
                            for p in (0, 1)]
                    bufs = [g.array(DTYPES[e.dtype], e.length) for g in segs]
                    slot.segs, slot.bufs = segs, bufs
                except OSError as exc:   # results travel as payload frames instead
                    self.drops.warn("shared-memory result segment", str(exc))
                    slot.segs = []
            if arr is not None:
                out.setdefault(ident, []).append(
                    (Entry(e.key, e.part, e.round, ACK, e.dtype, e.length), None))
                self.records.pushed(w, e, arr.nbytes)
            if e.flags & ASYNC and arr is not None and self.replica.active:
                self.replica.forward(e, arr, rank)     # copied before its pull is answered
            if slot.engine < 0:
                self.apply(slot, e, arr, rank, ident, out)
            else:
                self.queues[slot.engine].put((slot, e, arr, rank, ident))
        self.replies.deliver(out)             # acks and inline results of one receive burst

    def apply(self, slot: Slot, e: Entry, arr, rank: int, ident, out: dict) -> None:
        """Apply one entry; a malformed compressed push is dropped with a log line."""
        try:
            if e.flags & ASYNC:
                if arr is not None and e.flags & COMP:
                    arr = slot.unpack(arr, e.round, nonfinite=e.flags & NONFINITE)
                return self.async_store.apply(slot, e, arr, rank, ident, self.async_ranks(),
                                              out, self.leaves.get(rank))
            # other keys keep rounds (compressed pushes decompressed only when summed);
            # averaged on this server unless it has a backup (backups keep raw sums)
            apply(slot, e, arr, rank, ident, self.nworkers, out, self.joined,
                  0 if self.replica.active else self.size, self.leaves.get(rank),
                  not e.flags & (SHM | COMP))     # a socket frame: ours to overwrite
        except CompressionError as exc:
            name = self.decls.get(e.key, {}).get("name", e.key)
            self.drops.warn("malformed compressed push",
                            f"tensor {name!r} partition {e.part} from rank {rank}: {exc}")

    def async_ranks(self) -> dict:      # who bounds the staleness (store.async_groups)
        return async_groups(self.workers_by_id.values(), self.local_reduce,
                            self.joined_ranks, self.gone)

    # ---------------------------------------------------------------- engines
    def engine(self, q: queue.SimpleQueue) -> None:
        while True:
            slot, e, arr, rank, ident = q.get()
            if e is None:               # a membership change: recheck this slot's rounds
                try:
                    self.recheck(slot)
                except Exception:
                    log.exception("server engine thread: recheck failed")
                continue
            out: dict = {}
            try:
                self.apply(slot, e, arr, rank, ident, out)
            except Exception:      # a bug must not silently stop this engine thread
                log.exception("server engine thread: entry %s from rank %d failed", e, rank)
            if out:
                self.replies.queue(out)

    # what the other server modules send through (decls.py, replica.py)
    def send_results(self, out: dict) -> None:
        self.replies.results(out)

    def send(self, ident: bytes, op: int, body, payload=()) -> None:
        self.replies.send(ident, op, body, payload)


def main(cfg: Config | None = None) -> int:
    from byteps.common.logs import setup_logging
    cfg = cfg or Config.from_env(role="server")
    setup_logging(cfg, "server")
    try:
        server = Server(cfg)
    except (BytePSError, transport.TransportError) as exc:
        log.error("%s", exc)
        return 2
    return server.run()


if __name__ == "__main__":
    sys.exit(main())


def _started_like_the_original() -> bool:
    """The original BytePS starts servers and the scheduler with
    ``DMLC_ROLE=server|scheduler python3 -c 'import byteps.server'``: keep that working."""
    return sys.argv[:1] == ["-c"] and os.environ.get("DMLC_ROLE") in ("server", "scheduler")


if __name__ != "__main__" and _started_like_the_original():
    if os.environ["DMLC_ROLE"] == "scheduler":
        from byteps.scheduler import main as _scheduler_main
        sys.exit(_scheduler_main())
    sys.exit(main())

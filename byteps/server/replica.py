"""Server replication and failover (``BYTEPS_SERVER_REPLICAS=1``; docs/fault_tolerance.md).

Every server ``i`` of the address book has a backup, server ``(i + 1) mod S``.  What a
server copies to its backup, before any worker sees a result that depends on it:

* **a finished synchronous round** (its result, raw or as the compressed frame every
  worker pulls): the pulls of round ``r`` are answered only once the backup confirmed
  round ``r``.  So when a server dies, every round some worker already received is on
  the backup, and every other round is still in flight on every worker (its push is
  kept until the result comes), and is resent.
* **every asynchronous push** (``wire.ASYNC``) with its rank and round: the backup adds it
  to its own copy of the value and records the (rank, round) like the primary, so after a
  failover a resent push is not added twice.  A pull is answered once the backup confirmed
  every push forwarded before it.

Not copied: the server-side error-feedback residual of a compressed tensor (as large as
the uncompressed tensor: copying it each round would cost what compression saves).  After
a failover the new owner compresses the dead server's tensors with a zero residual: one
round's compression error is not fed back.  Synchronous uncompressed rounds are
unaffected: results after a failover are bit for bit those of an undisturbed run.

When the scheduler declares a server dead (``FAILOVER``), its backup owns its keys: the
workers resend their rounds in flight there, and the backup answers a round it holds a
copy of without adding the resent pushes (rank, key, round are deduplicated as for any
resend).  Replication then stops everywhere: a second server death ends the job.

Frames between servers are authenticated like every other (MAC, sender bound to the
connection by HELLO, sequence numbers) and validated by ``wire.decode``.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import time

import numpy as np
import zmq

from byteps import transport
from byteps.common import variables
from byteps.common.node import describe
from byteps.server.store import Round
from byteps.transport.wire import (ACK, ASYNC, COMP, DTYPES, NONFINITE, PULL, PUSH, Entry, Op,
                                   WireError, decode, encode, entry_array, failover_body,
                                   frame_bytes, new_seq, payload_count)

log = logging.getLogger("byteps.server")
HELLO_RETRY_S = 0.05


class Replicator:
    """The replication state of one server: towards its backup (primary side) and for the
    servers it backs up (backup side).  Runs on the server's I/O thread only."""

    def __init__(self, server):
        self.srv = server
        self.replicas = server.cfg.server_replicas
        self.sock: zmq.Socket | None = None     # DEALER to the backup
        self.poller: zmq.Poller | None = None   # the server's, which watches sock
        self.closing = False                   # close sock at the next tick (failover)
        self.backup: dict | None = None
        self.ready = False                     # the backup answered HELLO (this epoch)
        self.degraded = False                  # a server died: no replication any more
        self.server_ids: set[int] = set()      # node ids of the other servers
        self.servers: dict[int, dict] = {}
        self.order: list = []                  # server node ids in address-book order
        self.peers: dict[bytes, dict] = {}     # connections of servers we back up
        self.seqs = transport.SeqTracker()
        self.seq = new_seq()
        self.hello_at = 0.0
        self.queue: list = []                  # (entries, decls, ranks, frames) before HELLO_OK
        self.told: set[int] = set()            # keys whose declaration the backup has
        self.sent: set[tuple] = set()          # (key, part, round) sent, not confirmed
        self.confirmed: dict[tuple, set] = {}  # (key, part) -> confirmed rounds (recent)
        self.parked: dict[tuple, list] = {}    # (key, part, round) -> [(ident, entry, arr)]
        self.forwarded: dict[tuple, int] = {}  # async (key, part) -> pushes forwarded
        self.acked: dict[tuple, int] = {}      # async (key, part) -> pushes confirmed
        self.parked_async: dict[tuple, list] = {}   # (key, part) -> [(needed, ident, e, arr)]
        self.stats = {"rounds": 0, "pushes": 0, "bytes": 0, "stored": 0}
        self.crash = _crash_knob()             # BYTEPS_TEST_SERVER_CRASH (tests only)

    @property
    def active(self) -> bool:
        return self.backup is not None and not self.degraded

    # ------------------------------------------------------------ address book
    def load_book(self, body: dict) -> None:
        """A (new) address book: find the backup, say HELLO to it (again, new epoch)."""
        servers = [s for s in body.get("servers") or [] if isinstance(s, dict)]
        me = next((i for i, s in enumerate(servers)
                   if s.get("node_id") == self.srv.link.node_id), -1)
        self.order = [s.get("node_id") for s in servers]
        self.servers = {s["node_id"]: s for s in servers
                        if s.get("node_id") != self.srv.link.node_id}
        self.server_ids = set(self.servers)
        self.seqs.forget()
        self.peers.clear()
        self.reset()
        if any(s.get("lost") is True for s in servers):    # re-formed after a failover
            self.degraded = True
        if self.replicas < 1 or len(servers) < 2 or me < 0 or self.degraded:
            return
        backup = servers[(me + 1) % len(servers)]
        if self.backup is None or self.backup["node_id"] != backup["node_id"]:
            if self.sock is not None:
                if self.poller is not None:
                    self.poller.unregister(self.sock)
                self.sock.close(0)
            ident = f"s{self.srv.link.node_id}/".encode() + secrets.token_hex(8).encode()
            self.sock = transport.connect(self.srv.ctx, backup["address"], ident)
            if self.poller is not None:
                self.poller.register(self.sock, zmq.POLLIN)
        self.backup, self.ready, self.hello_at = backup, False, 0.0
        if self.crash is not None and self.crash[0] != me:
            self.crash = None
        log.info("server %s: backup of its keys is %s (BYTEPS_SERVER_REPLICAS=%d)",
                 self.srv.address, describe(backup), self.replicas)

    def reset(self) -> None:
        """Round state was reset (new epoch, every rank joined): send what waits, forget."""
        waiting = [it for items in self.parked.values() for it in items]
        waiting += [it[1:] for items in self.parked_async.values() for it in items]
        self.parked.clear()
        self.parked_async.clear()
        self.sent.clear()
        self.confirmed.clear()
        self.forwarded.clear()
        self.acked.clear()
        self.queue.clear()
        self._release(waiting)

    def watch(self, poller: zmq.Poller) -> None:
        """The server's poller watches the backup's answers (HELLO_OK, REPLICA_OK)."""
        self.poller = poller
        if self.sock is not None:
            poller.register(self.sock, zmq.POLLIN)

    def tick(self, now: float) -> None:
        """Say HELLO to the backup until it answers (it may not have its book yet); after a
        failover, close the socket to it (outside the poller's event loop)."""
        if self.closing:
            self.closing = False
            if self.sock is not None:
                if self.poller is not None:
                    self.poller.unregister(self.sock)
                self.sock.close(0)     # drops copies never sent to a dead backup, now
                self.sock = None
        if self.active and not self.ready and now >= self.hello_at:
            self.hello_at = now + HELLO_RETRY_S
            self._send(Op.HELLO, {})

    # ------------------------------------------------------------ primary side
    def hold(self, out: dict) -> dict:
        """The part of ``out`` (identity -> [(entry, array)]) that may go now; results that
        the backup has not confirmed wait (and their round is sent to it)."""
        if not self.active:
            return out
        now: dict = {}
        for ident, items in out.items():
            keep = []
            for e, arr in items:
                if e.flags & ACK or arr is None:
                    keep.append((e, arr))
                    continue
                kp = (e.key, e.part)
                slot = self.srv.slots.get(kp)
                if kp in self.forwarded or (slot is not None and slot.value is not None):
                    # an asynchronous key: wait for every push forwarded so far
                    need = self.forwarded.get(kp, 0)
                    if self.acked.get(kp, 0) >= need:
                        keep.append((e, arr))
                    else:
                        self.parked_async.setdefault(kp, []).append((need, ident, e, arr))
                    continue
                if e.round in self.confirmed.get(kp, ()):
                    keep.append((e, arr))
                    continue
                k = (e.key, e.part, e.round)
                self.parked.setdefault(k, []).append((ident, e, arr))
                if k not in self.sent:
                    self.sent.add(k)
                    self._replicate(e._replace(flags=PULL | (e.flags & (COMP | NONFINITE))),
                                    -1, arr)
                    self.stats["rounds"] += 1
            if keep:
                now[ident] = keep
        return now

    def forward(self, e: Entry, arr, rank: int) -> None:
        """Copy an asynchronous push to the backup (before its pull can be answered)."""
        kp = (e.key, e.part)
        self.forwarded[kp] = self.forwarded.get(kp, 0) + 1
        self._replicate(e._replace(flags=PUSH | ASYNC | (e.flags & (COMP | NONFINITE))), rank,
                        arr)
        self.stats["pushes"] += 1

    def _replicate(self, entry: Entry, rank: int, arr) -> None:
        decls = []
        if entry.key not in self.told:
            d = self.srv.decls.get(entry.key, {})
            if "shape" in d:
                self.told.add(entry.key)
                spec = d.get("comp")
                decls.append([entry.key, d["name"], list(d["shape"]), d["dtype"], d["rank"],
                              spec.to_wire() if spec is not None else []]
                             + ([d["op"]] if d.get("op") or d.get("outer") else [])
                             + ([list(d["outer"])] if d.get("outer") else []))
        self.stats["bytes"] += arr.nbytes
        item = ([entry], decls, [rank], [arr])
        if not self.ready:
            self.queue.append(item)
        else:
            self._send(Op.REPLICA, list(item[:3]), item[3])

    def _send(self, op: int, body, payload=()) -> None:
        self.seq += 1
        frames = encode(self.srv.cfg.job_id, self.srv.link.node_id, op, self.srv.link.epoch,
                        self.seq, body, self.srv.secret)
        try:
            self.sock.send_multipart(frames + list(payload), copy=False)
        except zmq.ZMQError as exc:
            log.debug("cannot reach the backup server: %s", exc)

    def on_backup_reply(self) -> None:
        """HELLO_OK or REPLICA_OK from the backup (the server's poller saw our socket)."""
        for _ in range(64):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                hdr, _ = decode(frames, self.srv.cfg.job_id, self.srv.secret)
            except WireError as exc:
                self.srv.drops.warn("malformed message from the backup server", str(exc))
                continue
            if (self.backup is None or hdr.sender != self.backup["node_id"]
                    or hdr.epoch != self.srv.link.epoch
                    or not self.seqs.accept(("backup", hdr.sender), hdr.seq)):
                self.srv.drops.warn("message from the backup server of another node id, "
                                    "epoch or seq", f"sender {hdr.sender}, seq {hdr.seq}")
                continue
            if hdr.op == Op.HELLO_OK and not self.ready:
                self.ready = True
                # the connection is up: its data's congestion control
                transport.congestion.sweep(self.backup["address"], self.srv.cfg.tcp_congestion)
                for item in self.queue:
                    self._send(Op.REPLICA, list(item[:3]), item[3])
                self.queue.clear()
            elif hdr.op == Op.REPLICA_OK:
                self.confirm(hdr.body[0])

    def confirm(self, entries: list) -> None:
        """The backup stored these: release the results that waited for them."""
        ready: list = []
        for e in map(Entry._make, entries):      # validated by decode: 6 integers
            kp = (e.key, e.part)
            if e.flags & PUSH:
                n = self.acked[kp] = self.acked.get(kp, 0) + 1
                held = self.parked_async.get(kp, [])
                ready += [it[1:] for it in held if it[0] <= n]
                held[:] = [it for it in held if it[0] > n]
                continue
            k = (e.key, e.part, e.round)
            if k not in self.sent:
                continue
            self.sent.discard(k)
            done = self.confirmed.setdefault(kp, set())
            done.add(e.round)
            if len(done) > 4:                  # keep the recent rounds only
                done.difference_update(sorted(done)[:-4])
            ready += self.parked.pop(k, [])
            if self.crash is not None and e.round >= self.crash[1] and len(ready) > 1:
                self._crash(ready)
        self._release(ready)

    def _crash(self, ready: list) -> None:
        """BYTEPS_TEST_SERVER_CRASH=I:R (tests): server I answers one worker's pull of a
        round >= R, then dies by SIGKILL before answering the others (the case the copy
        on the backup is for: the other workers resend that round to it)."""
        first = ready[0][0]
        self._release([it for it in ready if it[0] == first])
        time.sleep(0.3)                    # let ZeroMQ put it on the wire
        log.warning("BYTEPS_TEST_SERVER_CRASH: answered one worker's round %d, now SIGKILL",
                    ready[0][1].round)
        os.kill(os.getpid(), signal.SIGKILL)

    def crash_on_hello(self) -> None:
        """BYTEPS_TEST_SERVER_CRASH=I:-1 (tests): server I dies by SIGKILL on a worker's
        first HELLO, unanswered (a server lost while the workers still greet it)."""
        if self.crash is not None and self.crash[1] < 0 and self.backup is not None:
            log.warning("BYTEPS_TEST_SERVER_CRASH: a worker's HELLO, now SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)

    def _release(self, items: list) -> None:
        out: dict = {}
        for ident, e, arr in items:
            out.setdefault(ident, []).append((e, arr))
        if out:
            self.srv.send_results(out)

    # ------------------------------------------------------------ backup side
    def on_peer(self, ident: bytes, hdr, payload: list, frames: list) -> None:
        """A message from another server (it replicates to us)."""
        s = self.servers.get(hdr.sender)
        if hdr.op == Op.HELLO:
            if hdr.epoch > self.srv.link.epoch:
                return            # our new book is on its way; the server says HELLO again
            if s is None or hdr.epoch != self.srv.link.epoch or \
                    not self.seqs.accept(hdr.sender, hdr.seq):
                return self.srv.drops.warn("server HELLO of a stale epoch or replayed",
                                           f"sender {hdr.sender}, seq {hdr.seq}")
            if any(p is s for i, p in self.peers.items() if i != ident):
                return self.srv.drops.warn("server HELLO for a node id bound to another "
                                           "connection", f"sender {hdr.sender}")
            self.peers[ident] = s
            self.srv.remember_connection(frames[1], dict(s, role="server"))
            return self.srv.send(ident, Op.HELLO_OK, {})
        if self.peers.get(ident) is not s or s is None or hdr.epoch != self.srv.link.epoch \
                or not self.seqs.accept(hdr.sender, hdr.seq):
            return self.srv.drops.warn("server message from an unbound connection, a stale "
                                       "epoch or replayed", f"sender {hdr.sender}")
        if hdr.op != Op.REPLICA:
            return self.srv.drops.warn("unexpected op from a server", Op(hdr.op).name)
        entries, decls, ranks = hdr.body
        if payload_count(entries, Op.REPLICA) != len(payload):
            return self.srv.drops.warn("replica with wrong payload count", str(len(payload)))
        w = {"rank": -1, "host_id": s.get("host_id"), "node_id": s["node_id"]}
        for d in decls:
            self.srv.tensors.declare(d, dict(w, rank=d[4]))
        stored = []
        for e, rank, frame in zip(map(Entry._make, entries), ranks, payload):
            try:
                if self.store(e, rank, frame):
                    stored.append(e._replace(flags=ACK | (e.flags & PUSH)))
            except (WireError, ValueError) as exc:    # CompressionError is a ValueError
                self.srv.drops.warn("malformed replica", f"from {describe(s)}: {exc}")
        self.srv.send(ident, Op.REPLICA_OK, [stored, []])

    def store(self, e: Entry, rank: int, frame) -> bool:
        """Keep a copy of a finished round, or add a forwarded asynchronous push."""
        srv = self.srv
        if e.key not in srv.decls or srv.decls[e.key].get("error"):
            raise WireError(f"key {e.key} without a valid declaration")
        slot = srv.slots.get((e.key, e.part)) or srv.tensors.new_slot(e, rank)
        if slot.dtype != e.dtype or slot.length != e.length:
            raise WireError(f"entry {e} does not match the stored {slot.length} x "
                            f"{DTYPES[slot.dtype].name}")
        arr = frame_bytes(frame) if e.flags & COMP else entry_array(e, frame)
        # the primary's own rule (an asynchronous key's exact push, AsyncPS's seed, is raw
        # even when the key is compressed), decided once in Tensors.comp_ok
        if not srv.tensors.comp_ok(slot, e, arr, rank):
            raise WireError(f"entry {e}: compression or frame size differs from the "
                            f"declaration")
        if e.flags & COMP:
            arr = np.frombuffer(arr, np.uint8)
        self.stats["stored"] += 1
        if e.flags & PUSH:
            if rank < 0:
                raise WireError(f"forwarded push {e} without a rank")
            entry = e._replace(flags=PUSH | ASYNC | (e.flags & (COMP | NONFINITE)))
            srv.apply(slot, entry, arr, rank, None, {})
            return True
        rs = slot.rounds.get(e.round)
        if rs is None:
            rs = slot.rounds[e.round] = Round()
        if rs.result is None:
            rs.result, rs.nonfinite = arr, bool(e.flags & NONFINITE)
        for old in [r for r in slot.rounds if r < e.round - 1]:
            del slot.rounds[old]
        return True

    # ------------------------------------------------------------ failover
    def on_failover(self, body: dict) -> None:
        """The scheduler declared a server dead: its backup owns its keys; replication
        stops (a second death ends the job); results that waited for a confirmation go."""
        try:
            dead, _ = failover_body(body)
        except WireError as exc:
            return self.srv.drops.warn("bad FAILOVER", str(exc))
        who = describe(dict(dead, role="server"))
        owner = dead["node_id"] in self.order and self._backs_up(dead)
        log.warning("%s died: %sreplication stops (a second server death ends the job)", who,
                    f"this server owns its keys now ({self.stats['stored']} copies received); "
                    if owner else "")
        self.degraded = True
        self.closing = True
        self.queue.clear()
        waiting = [it for items in self.parked.values() for it in items]
        waiting += [it[1:] for items in self.parked_async.values() for it in items]
        self.parked.clear()
        self.parked_async.clear()
        self._release(waiting)

    # ------------------------------------------------------------ freed keys (retire.py)
    def in_flight(self, key: int, part: int) -> bool:
        """A result of (key, part) was sent to the backup and waits for its confirmation."""
        return any(k[0] == key and k[1] == part for k in self.sent) or \
            any(k[0] == key and k[1] == part for k in self.parked) or \
            bool(self.parked_async.get((key, part)))

    def forget(self, key: int) -> None:
        """The server freed ``key``: drop what this side recorded about it (the backup frees
        its own copies when the workers' FREE reaches it)."""
        self.told.discard(key)
        for d in (self.confirmed, self.forwarded, self.acked, self.parked_async):
            for kp in [kp for kp in d if kp[0] == key]:
                del d[kp]

    def _backs_up(self, dead: dict) -> bool:
        o = self.order
        return o[(o.index(dead["node_id"]) + 1) % len(o)] == self.srv.link.node_id

    def close(self) -> None:
        if self.replicas:
            log.info("server %s replication: %d round(s) and %d asynchronous push(es) copied "
                     "to the backup (%d bytes); %d copies received", self.srv.address,
                     self.stats["rounds"], self.stats["pushes"], self.stats["bytes"],
                     self.stats["stored"])
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None


def _crash_knob() -> tuple[int, int] | None:
    """BYTEPS_TEST_SERVER_CRASH=I:R -> (server index I, round R); tests only."""
    raw = variables.value("BYTEPS_TEST_SERVER_CRASH") or ""
    try:
        i, r = (int(x) for x in raw.split(":"))
        return i, r
    except ValueError:
        return None

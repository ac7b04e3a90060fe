"""The worker engine: one background thread that owns every socket of a worker.

User threads submit partitions (:class:`Task`) into a priority heap; the
engine pops them in priority order while the credit window (bytes in flight)
allows, fuses small partitions bound for the same server into one message,
pushes them, and writes the pulled sums into the caller's output array.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import secrets
import threading
import time

import numpy as np
import zmq

from byteps import transport
from byteps.common import malloc
from byteps.common.config import Config
from byteps.core.engine.compression import (COMP_LR, CannotCompress, Compression,  # noqa: F401
                                            comp_flags, comp_pipeline, result_compressed)
from byteps.core.engine.servers import ServerLinks
from byteps.core.engine import deadlock as _deadlock
from byteps.core.engine.failover import WorkerFailover
from byteps.common.metrics import RoundLatency
from byteps.common.node import (BytePSError, SchedulerLink, describe, end_process_later,
                                held_tensors)
from byteps.core.engine.tasks import Handle, Task  # noqa: F401 (re-exported: api, local, tests)
from byteps.core.timeline import PushPullSpeed
from byteps.transport.wire import (ACK, ASYNC, AVG, COMP, PULL, PUSH, SHM, Entry, Op,
                                   WireError, average, entry_array, payload_count)

log = logging.getLogger("byteps.worker")
MAX_FUSED_ENTRIES, MAX_FUSED_BYTES = 256, 4 << 20
TICK_S = 0.01     # the scheduler link's heartbeat and connection check, at most this often

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class Engine:
    """The worker's I/O thread.  ``servers``: one connection per server of the address book
    (default: DEALER sockets to their addresses); with ``start=False`` the engine neither greets
    the servers nor starts its thread, and a caller drives :meth:`take_pending`, :meth:`dispatch`,
    :meth:`on_server`, :meth:`resend_overdue` (unit tests: tests/test_engine_unit.py).

    It holds the stages it drives: ``links`` (:class:`~byteps.core.engine.servers.ServerLinks`:
    the server connections), ``comp`` (:class:`~byteps.core.engine.compression.Compression`) and
    ``failover`` (:class:`~byteps.core.engine.failover.WorkerFailover`)."""

    def __init__(self, cfg: Config, ctx: zmq.Context | None, link: SchedulerLink, book: dict,
                 servers: list | None = None, start: bool = True):
        self.cfg, self.ctx, self.link = cfg, ctx, link
        malloc.tune(cfg.malloc_tune)        # receive buffers stay in the heap
        self.rank, self.size = book["rank"], book["size"]
        self.server_info = book["servers"]
        if servers is None:
            ident = f"w{self.rank}/".encode() + secrets.token_hex(8).encode()   # unguessable
            servers = [transport.connect(ctx, s["address"], ident) for s in self.server_info]
        self.drops = transport.RateLimitedLog(log)
        # robustness (docs/security.md): replay guard, dead-server watch, resends, drop knob
        self.links = ServerLinks(cfg, link, self.server_info, servers, self.rank, self.drops,
                                 watch=start)
        self.dropper = transport.Dropper(cfg.test_drop_rate, 104729 * link.node_id + 1)
        self.next_check = self.next_tick = 0.0
        # BYTEPS_SERVER_REPLICAS: dead servers' keys
        self.failover = WorkerFailover(cfg, self.server_info, self.rank, self.drops)
        self.comp = Compression(self.rank)
        self.bytes = self.comp.bytes   # tensor -> [pushed raw, pushed wire, pulled raw/wire]
        self.heap: list[Task] = []
        self.pending: collections.deque = collections.deque()
        self.control: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.inflight: dict[tuple, Task] = {}
        self.inflight_bytes = 0
        self.declared: set[tuple] = set()          # (tensor key, server index)
        self.fatal: BytePSError | None = None
        self.key_errors: dict[int, str] = {}
        self.barriers: dict[str, threading.Event] = {}
        self.barrier_errors: dict[str, str] = {}
        # a worker left this membership (a barrier or join() failed naming it): nothing
        # global can complete in it any more, so the next init() leaves it and forms anew
        self.peer_gone: str | None = None
        self.join_event: threading.Event | None = None
        self.join_result: dict = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.running = True
        self.tseq = itertools.count()
        self.timeline = None          # a byteps.core.timeline.Timeline when tracing
        self.hvd_timeline = None      # Horovod's timeline on rank 0 (hvd_timeline.py)
        self.speed = PushPullSpeed()
        self.rounds = RoundLatency(len(self.server_info))   # per-server histogram (metrics)
        self.probe = None     # autotune.Probe while the first steps are measured
        self.thread = threading.Thread(target=self.loop, name="byteps-engine", daemon=True)
        if start:       # failover: never greet lost ones, nor wait for one that dies
            self.links.hello(self.failover.dead, self.before_start)
            self.thread.start()

    def before_start(self, now: float) -> None:
        """While init() waits for the servers: the scheduler's messages, and heartbeats."""
        while self.link.sock.poll(0):
            self.on_scheduler()
        self.link.tick(now)

    @property
    def resends(self) -> int:
        """Partitions sent again (late answers; metrics)."""
        return self.links.resends

    # ---------------------------------------------------------------- user side
    def submit(self, tasks: list[Task]) -> None:
        self.request(tasks, self.pending.extend)

    def request(self, item, put=None) -> None:
        """Queue a control ``item`` for the engine thread (or ``put(item)``), and wake it."""
        with self.lock:
            if self.fatal:
                raise self.fatal
            (put or self.control.append)(item)
        self.wake()

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def wait(self, ev: threading.Event, check=None) -> None:
        """Wait for ``ev``; raise the engine's fatal error; ``check()`` (may raise) every 0.2 s."""
        while not ev.wait(0.2) and not self.fatal:
            if check is not None:
                check()
        if self.fatal:
            raise self.fatal

    def barrier(self, name: str, check=None) -> None:
        """Wait until every worker reaches barrier ``name``; ``check()`` (may raise) every 0.2 s."""
        ev = threading.Event()
        self.barriers[name] = ev
        self.request(("barrier", name))
        self.wait(ev, check)
        err = self.barrier_errors.pop(name, None)
        if err:
            raise BytePSError(f"worker rank {self.rank}: barrier cannot complete: {err}")

    def join(self) -> int:
        """Tell the scheduler this rank is out of data; wait until every rank is (the
        servers count joined ranks as pushing zeros).  Returns the last rank to join."""
        ev = self.join_event = threading.Event()
        self.join_result = {}
        self.request(("join", None))
        self.wait(ev)
        body = self.join_result
        if body.get("error") is not None:
            raise BytePSError(f"worker rank {self.rank}: {body['error']}")
        last = body.get("last_rank")
        if type(last) is not int:
            raise BytePSError(f"worker rank {self.rank}: malformed JOIN_DONE {body!r:.200}")
        return last

    def stop(self, leave: bool = True) -> None:
        if self.thread.is_alive():
            self.request(("stop", leave))
            self.thread.join(10)
        self.links.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    # ---------------------------------------------------------------- engine thread
    def loop(self) -> None:
        poller = zmq.Poller()
        for s in self.links.conns:
            poller.register(s, zmq.POLLIN)
        poller.register(self.link.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        try:
            while self.running:
                for sock, _ in poller.poll(100):
                    if sock is self.wake_r:
                        os.read(self.wake_r, 4096)
                    elif sock is self.link.sock:
                        self.on_scheduler()
                    else:
                        for _ in range(64):
                            if not sock.get(_EVENTS) & _POLLIN:    # cheaper than poll(0)
                                break
                            self.on_server(sock)
                self.take_pending()
                self.dispatch()
                now = time.monotonic()
                if now < self.next_tick:     # not after every message: a syscall each
                    continue
                self.next_tick = now + TICK_S
                self.link.tick(now)
                if now >= self.next_check:
                    self.next_check = now + 0.2
                    self.links.check(now, self.failover.grace)
                    self.resend_overdue(now)
        except BytePSError as exc:
            self.fail_all(exc)
        except Exception as exc:  # a bug must not leave users hanging
            log.exception("engine thread crashed")
            self.fail_all(BytePSError(f"worker rank {self.rank}: engine thread crashed: {exc!r}"))

    def take_pending(self) -> None:
        if self.pending and self.hvd_timeline is not None:
            self.hvd_timeline.cycle()          # Horovod's CYCLE_START (hvd_timeline.py)
        with self.lock:
            while self.pending:
                heapq.heappush(self.heap, self.pending.popleft())
            items = list(self.control)
            self.control.clear()
        for kind, arg in items:
            if kind == "barrier":
                self.link.send(Op.BARRIER, {"name": arg})
            elif kind == "join":
                self.link.send(Op.JOIN, {})
            elif kind == "retire":     # keys autotune left behind (byteps/core/autotune/retire.py)
                self.retire_keys(*arg)
            elif kind == "stop":
                if arg:
                    self.link.send(Op.LEAVE, {})
                self.running = False

    def dispatch(self) -> None:
        credit = self.cfg.credit_bytes
        batches: dict[int, list[Task]] = {}
        batch_bytes: dict[int, int] = {}
        while self.heap:
            t = self.heap[0]
            server = self.failover.route[t.server]     # a dead server's partitions move
            c = self.links.charge(t, server)
            if self.inflight_bytes and self.inflight_bytes + c > credit:
                break
            heapq.heappop(self.heap)
            if t.handle.error is not None:
                continue
            t.server, t.credit = server, c
            self.inflight[(t.handle.tensor.key, t.part)] = t
            t.acked, t.tries = False, 0
            self.inflight_bytes += c     # credit: released when the server acks
            if t.nbytes > self.cfg.fusion_bytes:
                b = batches.pop(t.server, None)      # smaller ones before it leave first:
                if b:                                # a server gets them in heap order
                    del batch_bytes[t.server]
                    self.send_tasks(t.server, b)
                self.send_tasks(t.server, [t])
                continue
            b = batches.setdefault(t.server, [])
            b.append(t)
            batch_bytes[t.server] = batch_bytes.get(t.server, 0) + t.nbytes
            if len(b) >= MAX_FUSED_ENTRIES or batch_bytes[t.server] >= MAX_FUSED_BYTES:
                self.send_tasks(t.server, batches.pop(t.server))
                del batch_bytes[t.server]
        for server, b in batches.items():
            self.send_tasks(server, b)

    def send_tasks(self, server: int, tasks: list[Task]) -> None:
        entries, decls, payload = [], [], []
        now = time.monotonic()
        sent: set = set()
        for t in tasks:
            tn = t.handle.tensor
            # declare with every push until the server has acknowledged one (drops, resends)
            if (tn.key, server) not in self.declared and tn.key not in sent:
                sent.add(tn.key)
                decl = [tn.key, tn.name, list(tn.shape), tn.dtype_code, self.rank,
                        getattr(tn, "comp_wire", [])]
                outer = getattr(tn, "outer", None)   # DiLoCo's outer optimizer (wire v5)
                if getattr(tn, "op", 0) or outer:    # min/max/product (wire.REDUCE_OPS)
                    decl.append(getattr(tn, "op", 0))
                if outer:
                    decl.append(list(outer))
                decls.append(decl)
                self.links.held[server][tn.key] = tn.name
            if t.comp is not None:         # compressed: over the socket even when colocated
                if t.wire is None:
                    try:
                        t.wire = self.comp.compress(t, self.timeline)
                    except CannotCompress as exc:      # e.g. inf/NaN in the gradient
                        self.drop_task(t, exc)
                        continue
                entries.append(Entry(tn.key, t.part, t.round,
                                     PUSH | PULL | comp_flags(tn, t.wire), tn.dtype_code, t.length))
                payload.append(t.wire)
                t.sent_at = now
                continue
            self.comp.count(tn.name, t.src.nbytes, t.src.nbytes, 0)
            flags = PUSH | PULL | getattr(tn, "wire_flags", 0)
            seg = self.links.push_segment(t, server) if self.links.shm_ok[server] else None
            if seg is not None:
                np.copyto(seg, t.src)
                # no AVG: this worker copies the result out of shared memory anyway, and
                # divides as it copies at no cost; the server's division would be a pass
                entries.append(Entry(tn.key, t.part, t.round, flags | SHM, tn.dtype_code,
                                     t.length))
            else:
                if t.handle.average and self.size > 1 and not flags & ASYNC and \
                        t.src.dtype.kind == "f":
                    flags |= AVG      # the server may divide the sum (wire.average)
                entries.append(Entry(tn.key, t.part, t.round, flags, tn.dtype_code, t.length))
                payload.append(self.links.push_frame(t))
            t.sent_at = now
        self.links.send(server, Op.DATA, [entries, decls], payload)
        if self.probe is not None:        # autotune's measurements (byteps/core/autotune/)
            for t in tasks:
                self.probe.sent(server, t.nbytes, now)

    def on_server(self, sock) -> None:
        hdr, payload = self.links.recv(sock)
        server = self.links.index[sock]
        if hdr is None or server in self.failover.dead:
            return
        if hdr.epoch != self.link.epoch:
            return self.drops.warn("message from a stale epoch", str(hdr.epoch))
        if hdr.op == Op.DATA_ERROR:
            return self.on_key_error(hdr.body)
        if hdr.op != Op.RESULT or self.dropper.drop():     # BYTEPS_TEST_DROP_RATE
            return
        self.links.heard[server] = time.monotonic()
        entries = hdr.body[0]
        if payload_count(entries, Op.RESULT) != len(payload):
            return self.drops.warn("result with wrong payload count", str(len(payload)))
        it = iter(payload)
        for e in map(Entry._make, entries):      # validated by decode: 6 integers
            self.declared.add((e.key, server))
            if e.flags & ACK:
                t = self.inflight.get((e.key, e.part))
                if t is not None and t.round == e.round and not t.acked:
                    t.acked = True
                    self.inflight_bytes -= t.credit
                    self.rounds.pushed(server, time.monotonic() - t.sent_at)   # upload time
                    if self.probe is not None:
                        self.probe.acked(server, t.nbytes, t.sent_at, time.monotonic())
                    if self.timeline is not None:
                        self.timeline.acked(t, time.monotonic())
                    if t.handle.hvd is not None:
                        t.handle.hvd.acks[t.part] = time.monotonic()
                continue
            frame = None if e.flags & SHM else next(it)
            t = self.inflight.get((e.key, e.part))
            if t is None or t.round != e.round:
                continue          # duplicate or stale
            try:
                if bool(e.flags & COMP) != result_compressed(t):
                    raise WireError(f"result {list(e)} is {'' if e.flags & COMP else 'un'}"
                                    f"compressed, the tensor is not")
                if e.flags & COMP:
                    arr = self.comp.decompress(t, e, frame, self.timeline)
                else:
                    arr = self.links.result_segment(server, e) if frame is None \
                        else entry_array(e, frame)
                    self.comp.count(t.handle.tensor.name, 0, 0, arr.nbytes)
            except (WireError, OSError, ValueError) as exc:   # CompressionError is a ValueError
                self.drops.warn("truncated or malformed result", str(exc))
                continue
            del self.inflight[(e.key, e.part)]
            if not t.acked:
                self.inflight_bytes -= t.credit
                if self.probe is not None:
                    self.probe.acked(server, t.nbytes, t.sent_at, time.monotonic())
            self.complete(t, arr, e.flags & AVG)

    def complete(self, t: Task, arr: np.ndarray, averaged: int = 0) -> None:
        t_result = time.monotonic()
        h = t.handle
        dst = h.flat_out[t.start:t.start + t.length]
        if h.average and self.size > 1 and not averaged:
            average(arr, self.size, dst)
        elif arr is not dst:            # a decompressed result may already be in place
            np.copyto(dst, arr)
        now = time.monotonic()
        self.speed.add(t.src.nbytes, now)
        self.rounds.observe(t.server, t_result - t.sent_at)
        if self.timeline is not None:
            self.timeline.part_done(t, t_result, now)
        if h.hvd is not None:
            h.hvd.part(t, t_result)
        h.remaining -= 1
        if h.remaining == 0:
            self.speed.op_done(now - h.t0)
            if self.timeline is not None:
                self.timeline.handle_done(h, now)
            h.tensor.busy = None
            h.done()

    def on_key_error(self, body: dict) -> None:
        key, msg = body.get("key"), body.get("message")
        if type(key) is not int or not isinstance(msg, str):
            return self.drops.warn("bad DATA_ERROR", repr(body)[:200])
        self.key_errors[key] = msg
        if body.get("gone") is True:     # a rank left this membership: nothing global
            self.peer_gone = msg[:2000]  # completes in it, api.init() forms the group anew
        err = BytePSError(msg)
        for k in [k for k in self.inflight if k[0] == key]:
            t = self.inflight.pop(k)
            if not t.acked:
                self.inflight_bytes -= t.credit
            self.fail_handle(t.handle, err)
        for t in self.heap:
            if t.handle.tensor.key == key:
                self.fail_handle(t.handle, err)

    def on_scheduler(self) -> None:
        hdr = self.link.recv()
        if hdr is None:
            return
        if hdr.op == Op.BARRIER_DONE:
            name = hdr.body.get("name")
            ev = self.barriers.pop(name, None)
            if ev:
                if hdr.body.get("error") is not None:
                    self.barrier_errors[name] = str(hdr.body["error"])[:2000]
                    self.peer_gone = self.barrier_errors[name]   # api.init() forms anew
                ev.set()
        elif hdr.op == Op.JOIN_DONE:
            ev = self.join_event
            if ev is not None and not ev.is_set():
                if hdr.body.get("error") is not None:
                    self.peer_gone = str(hdr.body["error"])[:2000]
                self.join_result = hdr.body
                ev.set()
        elif hdr.op == Op.NODE_DEAD:
            dead = hdr.body.get("dead") or {}
            i = next((i for i, s in enumerate(self.server_info)
                      if dead.get("role") == "server" and s["node_id"] == dead.get("node_id")), -1)
            held = (f"; it held {held_tensors(self.links.held[i])}; those push_pulls cannot "
                    f"complete" if i >= 0 else "")
            raise BytePSError(f"worker rank {self.rank}: {describe(dead)} died: "
                              f"{hdr.body.get('reason')}{held}")
        elif hdr.op == Op.HEARTBEAT_ACK:    # --stacks, a deadlock (engine/deadlock.py)
            _deadlock.on_ack(self, hdr.body)
        elif hdr.op == Op.ELASTIC:        # membership change (byteps/core/elastic/)
            from byteps.core.elastic import on_message
            on_message(self, hdr.body)
        elif hdr.op == Op.FAILOVER:
            self.failover.take_over(self, hdr.body)
        elif hdr.op == Op.TERMINATE and hdr.body.get("ok") is not True:
            raise BytePSError(f"worker rank {self.rank}: the job was ended: "
                              f"{hdr.body.get('reason')}")

    def resend_overdue(self, now: float) -> None:
        """Resend partitions whose answer is late (:meth:`ServerLinks.resend`)."""
        self.links.resend(self.inflight.values(), now, self.send_tasks)

    def retire_keys(self, keys: list, again) -> None:
        """Forget this worker's state of ``keys`` (autotune/retire.py: declarations sent, shm
        segments) and ask every live server to free them (``FREE``); a key with a partition
        queued or in flight goes back to ``again`` (retried at a later step), never freed."""
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
        self.links.free(keys, self.failover.dead)

    def drop_task(self, t: Task, err: BytePSError) -> None:
        """Take an unsent task out of flight and fail its handle."""
        if self.inflight.pop((t.handle.tensor.key, t.part), None) is not None:
            self.inflight_bytes -= t.credit
        self.fail_handle(t.handle, err)

    def fail_handle(self, h: Handle, err: BytePSError) -> None:
        if h.error is None:
            h.error = err
            h.tensor.busy = None
            h.done()

    def fail_all(self, err: BytePSError) -> None:
        # a worker that exited with an error printed it itself: the others only note it
        (log.info if " exited with an error: " in str(err) else log.error)("%s", err)
        with self.lock:
            self.fatal = err
            tasks = list(self.inflight.values()) + self.heap + list(self.pending)
            self.pending.clear()
        for t in tasks:
            self.fail_handle(t.handle, err)
        for ev in self.barriers.values():
            ev.set()
        if self.join_event is not None:
            self.join_event.set()
        self.running = False
        end_process_later(f"worker rank {self.rank}", err)

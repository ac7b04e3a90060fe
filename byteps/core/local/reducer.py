"""The local reduction of one worker process: shared memory among the local ranks of a host.

Each push_pull becomes an :class:`Op` that flows, chunk by chunk
(``BYTEPS_PARTITION_BYTES``) and in priority order, through these stages::

    copy    my input chunk -> my input slot in shared memory        (every rank)
    l1      sum my part of the chunk over my group's inputs        (two-level only)
    reduce  sum my slice of the chunk over all inputs / group sums (reduce-scatter)
    net     push_pull the reduced slice through the Engine          (the network client)
    gather  copy the finished chunk into my output                  (all-gather)

Each stage writes ``round+1`` into a per-chunk counter of the segment after
its data, then sends the tensor key (8 raw bytes) to the other local ranks
over ``ipc://`` PUSH sockets, which wakes them without busy-waiting.  With
``BYTEPS_LOCAL_REDUCE=root`` (the default) local rank 0 pushes every slice k
under the name ``<name>.slice<k>``; with ``slice`` local rank k pushes slice k.
Either way each key gets one push per host, and averages divide by the
global number of workers.  The stages and their order are :class:`.stages.Stages`
(this reducer's ``stages``), autotune's cuts of a tensor :class:`.cuts.Cuts` (its ``cuts``).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import struct
import threading
import time

import numpy as np
import zmq

from byteps.core.engine import Handle, Task, comp_pipeline  # noqa: F401 (old import place)
from byteps.core.local.cuts import Cuts
from byteps.core.local.join import JoinState, note
from byteps.core.local.parts import EngineSpeed, NetDone, Op, SliceTensor, alive
from byteps.common.shm_cleanup import remove_prefix
from byteps.core.local.settle import BarrierSettle
from byteps.core.local.shm import Segment, SegmentMismatch, host_prefix, shm_dir, warn_once
from byteps.core.local.stages import Stages, identity
from byteps.common.errors import BytePSError
from byteps.transport.wire import ASYNC

log = logging.getLogger("byteps.local")
_KEY = struct.Struct("<q")
SMALL_BYTES = 65536     # a tensor up to this size is reduced by one local rank: fewer hand-offs


class LocalReducer:
    """Background thread that runs the local stages of every push_pull of this process."""

    def __init__(self, cfg, engine, book: dict, epoch: int, mode: str, groups: list[list[int]]):
        self.cfg, self.engine, self.mode = cfg, engine, mode
        self.L, self.me = cfg.local_size, cfg.local_rank
        workers = book["workers"]
        self.peers = {w["local_rank"]: w for w in workers if w["host_id"] == cfg.host_id}
        if sorted(self.peers) != list(range(self.L)):
            raise BytePSError(f"host {cfg.host_id}: the address book lists local ranks "
                              f"{sorted(self.peers)}, expected 0..{self.L - 1}")
        # peers whose pid this process can see (another pid namespace: not watched)
        self.watched = {r: w for r, w in self.peers.items() if r != self.me and alive(w.get("pid"))}
        self.nhosts = len({w["host_id"] for w in workers})
        self.network = self.nhosts > 1
        self.groups = groups
        self.dir = shm_dir(cfg.shm_dir)
        self.prefix = host_prefix(cfg.job_id, cfg.host_id) + f"e{epoch}-"
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(self._ipc(self.me))
        self.push = {}
        for r in range(self.L):
            if r != self.me:
                s = self.ctx.socket(zmq.PUSH)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, 10000)
                # a peer that binds later (init) is reached in ms, not zmq's 100 ms retry
                s.setsockopt(zmq.RECONNECT_IVL, 1)
                s.setsockopt(zmq.RECONNECT_IVL_MAX, 10)
                s.connect(self._ipc(r))
                self.push[r] = s
        # per layout key (a tensor's name key, or autotune's key of another cut of it)
        self.segs: dict[int, Segment] = {}
        self.markers: list[str | None] = []   # "small shm" warning markers this process made
        self.slice_cache: dict[int, list] = {}
        self.rounds: dict[int, int] = {}
        # autotune's cuts (.cuts); autotune sets self.cfg (its partition size), cfg is the initial
        self.cuts = Cuts(cfg, lambda: self.cfg, self.network, mode, self.me, self.L, self.segs,
                         self.slice_cache, self._slices)
        self.by_key: dict[int, Op] = {}
        self.lock = threading.Lock()
        self.incoming: collections.deque = collections.deque()
        self.events: collections.deque = collections.deque()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.seq = 0
        self.out_keys: set[int] = set()       # tensors to announce to the peers (batched)
        speed = getattr(engine.speed, "real", engine.speed)
        engine.speed = EngineSpeed(speed)
        # the data stages and their order (.stages), run on this reducer's thread
        self.stages = Stages(self.me, self.L, groups, book["size"], max(1, len(book["servers"])),
                             self.network, mode, engine, speed, cfg.host_id, self._notify,
                             self.net_done)
        self.join = JoinState(os.path.join(self.dir, f"{self.prefix}joined"), self.L)
        self.join.flags.publish(self.me, cfg.partition_bytes)
        self.values: dict[int, np.ndarray] = {}   # asynchronous keys without a network stage
        self.fatal: BytePSError | None = None
        self.settle = BarrierSettle(self.L, self.me)
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="byteps-local", daemon=True)
        self.thread.start()

    @property
    def cfg(self):
        return self._cfg

    @cfg.setter
    def cfg(self, cfg) -> None:
        """Autotune's setting (user thread, at a step boundary), published to the host's
        other local ranks for their zeros after ``join()`` (:mod:`.join`)."""
        self._cfg = cfg
        if getattr(self, "join", None) is not None:
            self.join.flags.publish(self.me, cfg.partition_bytes)

    def _seg_path(self, lkey: int) -> str:
        """The shared segment of layout key ``lkey`` (made by the first local rank to push)."""
        return os.path.join(self.dir, f"{self.prefix}t{lkey:016x}")

    def _ipc(self, r: int) -> str:
        return f"ipc://{os.path.join(self.dir, self.prefix)}n{r}"

    # ------------------------------------------------------------ user thread
    def submit(self, hid: int, tensor, src: np.ndarray, out: np.ndarray, average: bool,
               priority: int, pre=None, raw: bool = False, cut: int | None = None) -> Handle:
        """Start the local push_pull of ``src`` (api.Tensor ``tensor``) into ``out``.

        ``pre(j, a, b)``, when given, returns this rank's share of chunk ``j`` already
        summed over its group (elements ``[a, b)``, e.g. by an NCCL reduce-scatter inside
        a PCIe switch): it replaces the copy and group stages, ``src`` only gives the
        layout.  See :meth:`.stages.Stages.pre_range`.  ``raw``: the slices go
        uncompressed (an exact push of a compressed asynchronous name, see
        ``api.push_pull_async``).  ``cut``: the chunk bytes (a joined rank's zeros, cut as
        the ranks still training cut; else autotune's current size).

        An asynchronous name (``tensor.wire_flags`` has ``ASYNC``) sums the local ranks'
        deltas here in full precision; the network client pushes the host's sum and the
        pulled value comes back to every local rank.  Without a network stage (one host)
        the value is kept here, alike on every local rank.
        """
        if self.fatal is not None:
            raise self.fatal
        flat_src = src.reshape(-1)
        n = flat_src.size
        cut = cut or self.cuts.chunk_bytes(src.nbytes, tensor.name)
        chunk = max(1, cut // src.dtype.itemsize)
        lkey = self.cuts.layout_key(tensor.key, src.nbytes, tensor.name, cut)
        seg = self.segs.get(lkey)
        if seg is None and n:
            path = self._seg_path(lkey)
            try:   # without a network stage the chunks may shrink to fit a small /dev/shm
                seg = Segment(path, tensor.name, src.dtype, tensor.dtype_code, n, self.L, chunk,
                              len(self.groups) if self.stages.two_level else 1, self.me,
                              fixed_chunk=self.network or pre is not None,
                              shape_tag=shape_tag(tensor.shape))
            except ValueError as exc:
                _fail_peers(path, tensor.name, self.me)   # the other local ranks fail too
                err = BytePSError(f"host {self.cfg.host_id}: {exc}")
                err.brief = self.me != 0 and isinstance(exc, SegmentMismatch)
                raise err from None
            if seg.fallback:
                self.markers.append(warn_once(self.dir, self.prefix, "%s", seg.fallback))
            seg.owner = self.owner_of(tensor.key, n * src.dtype.itemsize)
            self.segs[lkey] = seg
        if n:
            self.cuts.pushed(tensor, lkey, seg, src.nbytes, cut)
        h = Handle(hid, tensor, out, seg.C if n else 0, average)
        if self.engine.timeline is not None:
            self.engine.timeline.begin(hid, tensor.name, h.t0)
        if n == 0:
            tensor.busy = None
            h.done()
            return h
        op = Op()
        op.handle, op.tensor, op.seg = h, tensor, seg
        rnd = self.rounds.get(lkey, 0)
        self.rounds[lkey] = rnd + 1
        op.round, op.t = rnd, rnd + 1
        op.src, op.out, op.average = flat_src, h.flat_out, average
        self.seq += 1
        op.prio, op.seq = -priority, self.seq
        op.copy = op.l1 = op.red = op.net = op.gather = 0
        op.slices = self._slices(tensor, seg, lkey, src.nbytes, cut) if self.network else None
        op.started, op.warned, op.t_red = time.monotonic(), False, None
        op.pre = pre
        op.raw = raw
        op.net_round = self.join.net_round(lkey, rnd)
        op.value = None
        if getattr(tensor, "wire_flags", 0) & ASYNC and not self.network:
            op.value = self.values.get(lkey)
            if op.value is None:
                op.value = self.values[lkey] = np.zeros(n, src.dtype)
        if hid:                  # what a zero contribution after join() needs (.join)
            self.join.known[tensor.key] = (tensor, average, src.shape, src.dtype)
            note(os.path.join(self.dir, f"{self.prefix}n{tensor.key:016x}"), tensor, average, src)
        if pre is not None and not self.stages.two_level and len(self.groups) != 1:
            raise BytePSError("a pre-reduced contribution needs switch groups of more than one "
                              "local rank (see BYTEPS_PCIE_SWITCH_SIZE)")
        with self.lock:
            self.incoming.append(op)
        self._wake()
        return h

    def owner_of(self, key: int, nbytes: int) -> int | None:
        """The local rank that reduces a whole small tensor (None: every rank a slice)."""
        if nbytes > SMALL_BYTES:
            return None
        return 0 if self.mode == "root" else key % self.L

    def _slices(self, tensor, seg: Segment, lkey: int, nbytes: int,
                cut: int) -> list[SliceTensor]:
        sl = self.slice_cache.get(lkey)
        if sl is None:
            from byteps.core.api import tensor_key
            sl = []
            for k in range(self.L):
                length = sum(b - a for a, b in (seg.slice(j, k) for j in range(seg.C)))
                name = f"{tensor.name}.slice{k}"
                key = self.cuts.layout_key(tensor_key(name), nbytes, tensor.name, cut)
                sl.append(SliceTensor(name, key, length, tensor.dtype_code,
                                      getattr(tensor, "spec", None),
                                      getattr(tensor, "wire_flags", 0),
                                      getattr(tensor, "outer", None),
                                      getattr(tensor, "op", 0)))
            self.slice_cache[lkey] = sl
        return sl

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def net_done(self, nd: NetDone) -> None:
        """Engine thread: a slice chunk came back (or failed)."""
        if nd.h.error is None:
            nd.op.seg.done[nd.k, nd.j] = nd.op.t
        self.events.append(nd)
        self._wake()

    def close(self, remove: bool = False) -> None:
        """Stop the thread, close sockets, unlink the segments this process created."""
        if self.running:
            self.running = False
            self._wake()
            self.thread.join(5)
        # the last result's notice must reach the other local ranks: with no linger a rank
        # that ends first drops it, and they find the result only at their 200 ms check
        for s in self.push.values():
            s.close(100)
        self.pull.close(0)
        self.ctx.term()
        try:
            os.unlink(self._ipc(self.me)[len("ipc://"):])
        except OSError:
            pass
        for seg in self.segs.values():
            if seg.created:
                seg.unlink()
        self.join.close(unlink=self.me == 0)
        for m in filter(None, self.markers):
            try:
                os.unlink(m)
            except OSError:
                pass
        if remove:
            remove_prefix(self.dir, self.prefix)
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------ local thread
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        active: list[Op] = []
        dirty: set[int] = set()
        next_check = time.monotonic() + 0.5
        try:
            while self.running:
                ready = dict(poller.poll(200 if active else 1000))
                if self.wake_r in ready:
                    os.read(self.wake_r, 65536)
                    self.settle.flush(self.push)
                if self.pull in ready:
                    while True:
                        try:
                            msg = self.pull.recv(zmq.NOBLOCK, copy=True)
                        except zmq.Again:
                            break
                        if msg and len(msg) % 8 == 0:
                            dirty.update(struct.unpack(f"<{len(msg) // 8}q", msg))
                        else:
                            self.settle.got(msg)      # a peer passed a barrier (.settle)
                with self.lock:
                    new = list(self.incoming)
                    self.incoming.clear()
                if new and self.engine.hvd_timeline is not None:
                    self.engine.hvd_timeline.cycle()     # Horovod's CYCLE_START
                for op in new:
                    active.append(op)
                    self.by_key[op.tensor.key] = op
                    dirty.add(op.tensor.key)
                self.join.saw(dirty)
                if self.join.zeros:           # joined: zeros for the others' operations
                    self._zeros(dirty if ready else self.join.candidates())
                active.sort()
                while self.events:
                    nd = self.events.popleft()
                    if nd.h.error is not None:
                        self.stages.fail(nd.op, nd.h.error)
                    else:
                        self._notify(nd.op)
                    dirty.add(nd.op.tensor.key)
                now = time.monotonic()
                if not ready:
                    dirty.update(op.tensor.key for op in active)   # safety net
                for op in active:
                    if op.tensor.key in dirty:
                        self.stages.run(op)
                dirty.clear()
                self._flush()
                finished = [op for op in active if op.handle.event.is_set()]
                for op in finished:
                    active.remove(op)
                    if self.by_key.get(op.tensor.key) is op:
                        del self.by_key[op.tensor.key]
                if now >= next_check:
                    next_check = now + 0.5
                    if active:
                        self._check(active, now)
        except BytePSError as exc:
            self._fatal(exc, active)
        except Exception as exc:   # a bug must not leave users hanging
            log.exception("local reduction thread crashed")
            self._fatal(BytePSError(f"host {self.cfg.host_id} local rank {self.me}: local "
                                    f"reduction thread crashed: {exc!r}"), active)

    def _zeros(self, keys) -> None:
        """Joined (:mod:`.join`): start a zero contribution to each operation another
        local rank started on a tensor of ``keys`` that this rank has not (picked up at
        the loop's next pass, like the user's own).  Once every local rank has joined
        this ``join()`` nothing of it can start any more: what a local rank that already
        returned from it pushes meanwhile (next tensors, new names) is its next training,
        which this rank joins in itself after its own ``join()`` returns."""
        if self.join.done():
            return
        p = self.join.flags.training_partition(self.me, self.join.gen)   # the others' size
        cfg = self.cfg if p in (None, self.cfg.partition_bytes) else \
            dataclasses.replace(self.cfg, partition_bytes=p)
        for key in keys:
            if key in self.by_key:
                continue
            known = self.join.known.get(key) or self.join.learn(self.dir, self.prefix, key)
            if known is None:
                self._unknown(key)
                continue
            tensor, average, shape, dtype = known
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            cut = self.cuts.chunk_bytes(nbytes, tensor.name, cfg)
            lkey = self.cuts.layout_key(tensor.key, nbytes, tensor.name, cut)
            seg = self.segs.get(lkey)     # None: not pushed here in this cut (or learned)
            if seg is None and not os.path.exists(self._seg_path(lkey)):
                continue                  # no other local rank started it in this cut
            if seg is None or self.join.wanted(seg, self.me, self.rounds.get(lkey, 0)):
                z = identity(getattr(tensor, "op", 0), shape, dtype)
                self.submit(0, tensor, z, np.empty_like(z), average, 0, cut=cut)

    def _unknown(self, key: int) -> None:
        """A joined rank cannot add zeros to a tensor it never pushed and has no readable
        note of (:func:`.join.note`; e.g. a full /dev/shm, or a dtype numpy does not name):
        the local ranks that push it fail, naming why."""
        path = self._seg_path(key)
        if key in self.join.failed or not os.path.exists(path):
            return
        self.join.failed.add(key)
        log.error("host %s local rank %d called join() and never pushed the tensor of key "
                  "%#x, which another local rank pushes now, and its note %sn%016x (written "
                  "by the first local rank to push it) is missing or unreadable (a full "
                  "/dev/shm? see the warnings): push every tensor once on every local rank "
                  "before join()", self.cfg.host_id, self.me, key, self.prefix, key)
        _fail_peers(path, f"key {key:#x}", self.me)

    def _notify(self, op: Op) -> None:
        """Wake the other local ranks for ``op``: at once for a tensor of several chunks
        (pipelining), else batched with the other small tensors of this pass."""
        if op.seg.C <= 1:
            self.out_keys.add(op.tensor.key)
            return
        self._send_keys(_KEY.pack(op.tensor.key))

    def _flush(self) -> None:
        if self.out_keys:
            self._send_keys(struct.pack(f"<{len(self.out_keys)}q", *self.out_keys))
            self.out_keys.clear()
        if self.stages.out_tasks:
            tasks, self.stages.out_tasks = self.stages.out_tasks, []
            self.engine.submit(tasks)

    def _send_keys(self, msg: bytes) -> None:
        for s in self.push.values():
            try:
                s.send(msg, zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _fatal(self, err: BytePSError, active: list) -> None:
        log.error("%s", err)
        self.fatal = err
        with self.lock:
            active = active + list(self.incoming)
            self.incoming.clear()
        for op in active:
            self.stages.fail(op, err)
        try:
            self._flush()
        except (zmq.ZMQError, BytePSError):
            pass
        self.running = False
        remove_prefix(self.dir, self.prefix)

    def _check(self, active: list, now: float) -> None:
        """Fail fast when a local peer died; warn about stalled operations."""
        for r, w in self.watched.items():
            if not alive(w.get("pid")):
                raise BytePSError(
                    f"host {self.cfg.host_id}: local rank {r} (worker rank {w.get('rank')}, pid "
                    f"{w.get('pid')}) died; the local reduction of this host cannot continue")
        for op in active:
            if not op.warned and now - op.started > self.cfg.stall_warning_s:
                op.warned = True
                j = min(op.gather, op.seg.C - 1)
                late = [r for r in range(self.L) if op.seg.copied[r, j] < op.t]
                log.warning("tensor %r (round %d) waited %.0f s in the local reduction of host "
                            "%s; local rank(s) %s have not contributed chunk %d", op.tensor.name,
                            op.round, now - op.started, self.cfg.host_id, late or "none", j)


def _fail_peers(path: str, name: str, me: int) -> None:
    """A local rank that cannot use another one's shared buffer of ``name`` (another shape
    or dtype) marks its own share of that buffer failed, in the buffer's layout, so the
    local ranks waiting for it fail their push_pull naming it instead of waiting forever
    (their reduction threads look at these counters at least every 200 ms)."""
    from byteps.core.local.shm import HEADER
    from byteps.transport.wire import DTYPES
    try:
        with open(path, "rb") as f:
            hdr = [int(x) for x in np.frombuffer(f.read(HEADER * 8), np.int64)]
        seg = Segment(path, name, DTYPES[hdr[2]], hdr[2], hdr[3], hdr[4], hdr[7], hdr[6], me,
                      shape_tag=hdr[9])
    except (OSError, ValueError, IndexError) as exc:
        log.debug("cannot mark %r failed in %s: %s", name, path, exc)
        return
    seg.done[me, :] = -1
    seg.close()


def shape_tag(shape) -> int:
    """A 62-bit fingerprint of a tensor's shape, kept in its shared buffer's header so that
    local ranks pushing the same number of elements in another shape are told apart."""
    import hashlib
    raw = ",".join(map(str, shape)).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 2

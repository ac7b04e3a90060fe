"""The server's tensor declarations and the checks on each push: layout, compression
settings and reduce op agree across ranks; a compressed frame has the pipeline's size.

:class:`Tensors` owns a server's declarations, partition slots and the bytes each engine
thread sums; the :class:`byteps.server.Server` keeps one as ``tensors`` (its ``decls`` and
``slots`` are the same dicts, the names the hot path and the other server modules read).
"""
from __future__ import annotations

import logging
import os

from byteps.compression import CompressionError, Spec, server_pipeline
from byteps.server.outer import Outer
from byteps.server.store import Slot
from byteps.transport.wire import (ASYNC, COMP, DTYPES, NONFINITE, REDUCE_OPS, Entry, Op,
                                   outer_field)

log = logging.getLogger("byteps.server")
INLINE_BYTES = 256 * 1024     # partitions up to this size are summed on the I/O thread


class Tensors:
    """Declarations, slots and per-tensor errors of a server.

    ``drops``: the server's rate-limited log; ``peers``: its worker connections (a key's
    error goes to each, through ``send(ident, op, body)``); ``engines``: summation threads
    (:func:`engine_threads`); ``asynchronous``: BYTEPS_ENABLE_ASYNC (every key inline)."""

    def __init__(self, drops, peers: dict, send, engines: int = 0,
                 asynchronous: bool = False):
        self.decls: dict[int, dict] = {}      # tensor key -> declaration / error
        self.slots: dict[tuple, Slot] = {}    # (key, partition) -> round state
        self.engine_load = [0] * engines      # bytes of the slots each engine thread sums
        self.drops, self.peers, self.send = drops, peers, send
        self.asynchronous = asynchronous

    def comp_ok(self, slot: Slot, e: Entry, buf, rank: int) -> bool:
        """A push is compressed exactly when its tensor was declared with compression,
        and a compressed frame has exactly the pipeline's size (the rest is checked
        when it is decompressed); otherwise it is dropped, never acknowledged."""
        if bool(e.flags & COMP) == (slot.pipe is not None) and (
                slot.pipe is None or buf.nbytes == (0 if e.flags & NONFINITE else
                                                    slot.pipe.frame_bytes)):
            return not e.flags & NONFINITE or self._sync_nonfinite(slot, e, rank)
        if e.flags & ASYNC and not e.flags & COMP:   # an asynchronous key's exact push (AsyncPS's
            return True                        # seed, a pull's zeros): raw, length checked
        name = self.decls.get(e.key, {}).get("name", e.key)
        self.drops.warn("malformed compressed push", (
            f"tensor {name!r} partition {e.part} from rank {rank}: "
            + (f"frame of {buf.nbytes} bytes, expected {slot.pipe.frame_bytes}"
               if bool(e.flags & COMP) == (slot.pipe is not None) else
               f"{'compressed' if e.flags & COMP else 'raw'} push for a tensor declared "
               f"{'with' if slot.pipe is not None else 'without'} compression")))
        return False

    def _sync_nonfinite(self, slot: Slot, e: Entry, rank: int) -> bool:
        """A NONFINITE push (its partition held inf or NaN, byteps.transport.wire) is one
        of a round every rank waits for: a synchronous key's, or an outer optimizer's
        (DiLoCo), never one of an asynchronous key's pushes, which nobody waits for."""
        if not e.flags & ASYNC or slot.outer is not None:
            return True
        self.drops.warn("malformed compressed push", (
            f"tensor {self.decls.get(e.key, {}).get('name', e.key)!r} partition {e.part} "
            f"from rank {rank}: NONFINITE push of an asynchronous key"))
        return False

    def declare(self, d: list, w: dict) -> None:
        key, name, shape, dt, _, comp = d[:6]
        op = d[6] if len(d) > 6 else 0          # wire.REDUCE_OPS: sum, min, max, product
        outer = outer_field(d[7]) if len(d) > 7 else None   # DiLoCo (server/outer.py)
        try:
            spec = Spec.from_wire(comp) if comp else None
            if spec is not None and DTYPES[dt].kind != "f":
                raise CompressionError(f"compression of a {DTYPES[dt].name} tensor")
        except CompressionError as exc:
            return self.drops.warn("bad compression settings in a declaration",
                                   f"tensor {name!r} from rank {w['rank']}: {exc}")
        old = self.decls.get(key)
        if old is None:
            self.decls[key] = {"name": name, "shape": shape, "dtype": dt, "rank": w["rank"],
                               "host": w.get("host_id"), "comp": spec, "op": op,
                               "outer": outer}
        elif old.get("error"):
            return
        elif old.get("comp") != spec and old["name"] == name:
            def d(s):
                return s.describe() if s is not None else "no compression"
            self.key_error(key, (
                f"tensor {name!r}: rank {w['rank']} (host {w.get('host_id')}) pushed it with "
                f"{d(spec)} but rank {old['rank']} (host {old['host']}) declared {d(old['comp'])}"
                f" first; every rank must use the same compression_params for a tensor"))
        elif old.get("outer") != outer and old["name"] == name:
            self.key_error(key, (
                f"tensor {name!r}: rank {w['rank']} (host {w.get('host_id')}) declared the "
                f"outer optimizer (lr, momentum, nesterov) {outer} but rank {old['rank']} "
                f"(host {old['host']}) declared {old.get('outer')} first; every rank must "
                f"create DiLoCo with the same outer_lr, outer_momentum and nesterov"))
        elif old.get("op", 0) != op and old["name"] == name:
            self.key_error(key, (
                f"tensor {name!r}: rank {w['rank']} (host {w.get('host_id')}) reduces it with "
                f"op {REDUCE_OPS[op]} but rank {old['rank']} (host {old['host']}) declared op "
                f"{REDUCE_OPS[old.get('op', 0)]} first; every rank must use the same op"))
        elif (old["name"], old["shape"], old["dtype"]) != (name, shape, dt):
            self.key_error(key, (
                f"tensor {name!r}: rank {w['rank']} (host {w.get('host_id')}) pushed shape "
                f"{tuple(shape)} {DTYPES[dt].name} but rank {old['rank']} (host {old['host']}) "
                f"declared shape {tuple(old['shape'])} {DTYPES[old['dtype']].name} first"
                + ("" if old["name"] == name else f" (name hash collision with {old['name']!r})")
                + "; every rank must push the same shape and dtype under one name"))

    def new_slot(self, e: Entry, rank: int):
        nbytes = e.length * DTYPES[e.dtype].itemsize
        engine = -1
        if nbytes > INLINE_BYTES and self.engine_load and not self.asynchronous:
            engine = min(range(len(self.engine_load)), key=self.engine_load.__getitem__)
            self.engine_load[engine] += nbytes
        spec = self.decls.get(e.key, {}).get("comp")
        pipe = server_pipeline(spec, e.length, e.key, e.part) if spec is not None else None
        slot = Slot(e.key, e.part, e.dtype, e.length, engine, pipe,
                    self.decls.get(e.key, {}).get("op", 0))
        outer = self.decls.get(e.key, {}).get("outer")
        if outer is not None:               # DiLoCo: this server runs the outer optimizer
            slot.outer = Outer(*outer)
        self.slots[(e.key, e.part)] = slot
        return slot

    def mismatch(self, e: Entry, slot, rank) -> str:
        d = self.decls.get(e.key, {})
        return (f"tensor {d.get('name', e.key)!r} partition {e.part}: rank {rank} pushed "
                f"{e.length} x {DTYPES[e.dtype].name} but the server holds {slot.length} x "
                f"{DTYPES[slot.dtype].name} (declared by rank {d.get('rank')}); every rank "
                f"must push the same shape and dtype under one name")

    def key_error(self, key: int, message: str) -> None:
        d = self.decls.setdefault(key, {"name": str(key)})
        if not d.get("error"):
            log.error("%s", message)
        d["error"] = message
        for ident in list(self.peers):
            self.send(ident, Op.DATA_ERROR, {"key": key, "name": d.get("name", ""),
                                             "message": message})


    def drop(self, slot: Slot) -> int:
        """Forget one partition slot (its engine thread's share, buffers, shared-memory
        result segments); returns the bytes of buffers it held."""
        self.slots.pop((slot.key, slot.part), None)
        itemsize = DTYPES[slot.dtype].itemsize
        if slot.engine >= 0:
            self.engine_load[slot.engine] -= slot.length * itemsize
        held = (slot.length * itemsize * 2 if slot.bufs is not None else 0) + \
            sum(a.nbytes for a in (slot.value, slot.scratch) if a is not None)
        slot.reset_rounds()
        slot.bufs = slot.scratch = slot.value = slot.frames = None
        segs, slot.segs = slot.segs or (), None
        for seg in segs:
            seg.close()         # unlinked; the mapping goes once no view is left
        return held


def engine_threads(cfg) -> int:
    """Summation threads: ``BYTEPS_SERVER_ENGINE_THREAD``, or, when it is not set and this
    process may run on at most two CPUs, none: every partition is then summed on the I/O
    thread, because the hand-off (queue, wake-up pipe, GIL) costs more than it saves when
    there is no idle core to sum on (loopback 2 workers + 2 servers, 512 KB partitions:
    16 % less CPU and 13 % less time per push_pull; docs/scaling.md)."""
    if cfg.engine_threads_explicit:
        return cfg.server_engine_threads
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cfg.server_engine_threads if cpus > 2 else 0

"""The data stages of the local reduction and the order they go in: the copy into shared
memory, the group sum, the reduce-scatter, the slices' push_pull through the Engine and
the all-gather (:class:`Stages`, which :class:`byteps.core.local.reducer.LocalReducer`
keeps as its ``stages`` and runs on its thread).

Each stage works on one chunk of an :class:`~byteps.core.local.parts.Op`, writes its
counter (``round + 1``) into the shared segment and wakes the other local ranks (the
reducer's ``notify``); :meth:`Stages.run` decides which stage may go next.
"""
from __future__ import annotations

import time

import numpy as np

from byteps.core.engine import Handle, Task, comp_pipeline
from byteps.core.local.parts import NetDone, Op
from byteps.common.errors import BytePSError


#: wire.REDUCE_OPS (0 sum, 1 min, 2 max, 3 product) as the ufunc the local ranks reduce with
_UFUNCS = (np.add, np.minimum, np.maximum, np.multiply)
_F16 = np.dtype(np.float16)


def _ufunc(op: Op):
    return _UFUNCS[getattr(op.tensor, "op", 0)]


def identity(reduce_op: int, shape, dtype) -> np.ndarray:
    """What a joined local rank contributes: the identity of the reduction (0 for a sum,
    the dtype's largest value for a minimum, its smallest for a maximum, 1 for a product)."""
    dt = np.dtype(dtype)
    if reduce_op in (1, 2):
        info = np.finfo(dt) if dt.kind in "fc" else np.iinfo(dt) if dt.kind in "iu" else None
        if info is None:                 # bool travels as uint8 (collective/carry.py)
            return np.full(shape, reduce_op == 1, dt)
        return np.full(shape, info.max if reduce_op == 1 else info.min, dt)
    return np.ones(shape, dt) if reduce_op == 3 else np.zeros(shape, dt)


class RowSum:
    """``rowsum(rows, dst, ufunc)``: ``dst`` = the element-wise reduction of ``rows`` in
    their order (sum, or the tensor's op).  A float16 sum of three or more rows is
    accumulated in float32 and rounded once, as the servers do (byteps/server/tree.py),
    in a scratch array kept here (``f32``) and reused chunk after chunk."""
    __slots__ = ("f32",)

    def __init__(self):
        self.f32: np.ndarray | None = None

    def __call__(self, rows, dst: np.ndarray, ufunc=np.add) -> None:
        if ufunc is np.add and dst.dtype == _F16 and len(rows) > 2:
            acc = self.f32
            if acc is None or acc.size < dst.size:
                acc = self.f32 = np.empty(dst.size, np.float32)
            acc = acc[:dst.size]
            np.add(rows[0], rows[1], out=acc, dtype=np.float32)
            for r in rows[2:-1]:
                np.add(acc, r, out=acc, dtype=np.float32)
            np.add(acc, rows[-1], out=dst, dtype=np.float32, casting="same_kind")
            return
        ufunc(rows[0], rows[1], out=dst)
        for r in rows[2:]:
            ufunc(dst, r, out=dst)


class Stages:
    """The stages of this local rank (``me`` of ``L``) for every operation of its host.

    ``groups``: the local ranks' switch groups (two levels when there are several and
    not one per rank); ``size``: the job's ranks (averages divide by it); ``nservers``;
    ``network``: other hosts take part (the reduced slices go through ``engine``);
    ``mode``: ``root`` (local rank 0 pushes every slice) or ``slice``; ``speed``: the
    Engine's throughput meter; ``host_id`` names this host in the timeline.  Callbacks
    of the reducer: ``notify(op)`` wakes the other local ranks, ``net_done(NetDone)``
    takes a slice chunk back from the Engine (its thread).  Slices of single-chunk
    tensors wait in ``out_tasks`` for the reducer to submit them once a pass."""

    def __init__(self, me: int, L: int, groups: list[list[int]], size: int, nservers: int,
                 network: bool, mode: str, engine, speed, host_id, notify, net_done):
        self.me, self.L, self.groups, self.size, self.nservers = me, L, groups, size, nservers
        self.mygroup = next(g for g in groups if me in g)
        self.two_level = 1 < len(groups) < L
        self.network, self.mode, self.engine, self.speed = network, mode, engine, speed
        self.host_id, self.notify, self.net_done = host_id, notify, net_done
        self.out_tasks: list[Task] = []
        self.rowsum = RowSum()

    def run(self, op: Op) -> None:
        """Advance ``op`` as far as the counters allow, one chunk at a time."""
        seg, t, C = op.seg, op.t, op.seg.C
        while not op.handle.event.is_set():
            if op.gather < C:
                col = seg.done[:, op.gather]
                if (col < 0).any():
                    bad = [r for r in range(self.L) if col[r] < 0]
                    err = BytePSError(f"tensor {op.tensor.name!r}: local rank(s) {bad} of "
                                      f"host {self.host_id} failed this push_pull (see "
                                      f"their log)")
                    # one block per cause: local rank 0 prints the traceback (it fails
                    # either way), the other local ranks one line each
                    err.brief, err.secondary = self.me != 0, True
                    return self.fail(op, err)
                if (col >= t).all():
                    self._gather(op)
                    continue
            if op.slices is not None and self.mode == "root" and self.me == 0 and \
                    op.net < C * self.L and self._net_ready(op):
                self._root_net(op)
                continue
            if op.red < C and op.red < op.copy and self._reduce_ready(op):
                self._reduce(op)
                continue
            if self.two_level and op.l1 < op.copy and \
                    (seg.copied[self.mygroup, op.l1] >= t).all():
                self._level1(op)
                continue
            if op.copy < C and not seg.slot_free(op.copy, t):
                return                   # windowed: chunk copy - W is still being gathered
            if op.copy < C and op.pre is not None:
                self._copy_pre(op)
                continue
            if op.copy < C:
                self._copy(op)
                continue
            return

    def fail(self, op: Op, err: BytePSError) -> None:
        """``op`` fails with ``err`` here; its chunks are marked failed for the other
        local ranks, which fail it too (:meth:`run`)."""
        h = op.handle
        if h.error is None and not h.event.is_set():
            h.error = err
            op.tensor.busy = None
            try:
                op.seg.done[self.me, :] = -1
            except (TypeError, ValueError):
                pass
            h.done()
            self.notify(op)

    def _copy(self, op: Op) -> None:
        """My input chunk into my input slot of the shared segment."""
        seg, j = op.seg, op.copy
        a, b = seg.chunk_range(j)
        o = seg.off(j)
        seg.inputs[self.me, a + o:b + o] = op.src[a:b]
        seg.copied[self.me, j] = op.t
        op.copy += 1
        self.notify(op)

    def pre_range(self, seg_or_chunks, j: int) -> tuple[int, int]:
        """Elements [a, b) of chunk ``j`` that ``pre`` must return for this rank."""
        g = self.mygroup
        if self.two_level:
            return seg_or_chunks.split(j, len(g), g.index(self.me))
        return seg_or_chunks.slice(j, self.me)

    def _copy_pre(self, op: Op) -> None:
        """The group sum of my share of a chunk is given: write it where the group stage
        would have (group sums, or straight into my slice with a single group)."""
        seg, j = op.seg, op.copy
        a, b = self.pre_range(seg, j)
        o = seg.off(j)
        if b > a:
            part = op.pre(j, a, b)
            if self.two_level:
                np.copyto(seg.gsum[self.groups.index(self.mygroup), a + o:b + o], part)
            else:
                np.copyto(seg.out[a + o:b + o], part)
        seg.copied[self.me, j] = op.t
        if self.two_level:
            seg.gdone[self.me, j] = op.t
        op.copy += 1
        op.l1 = op.copy
        self.notify(op)

    def _reduce_ready(self, op: Op) -> bool:
        j = op.red
        if op.pre is not None and not self.two_level:
            return True                  # my slice is the group sum already
        if self.two_level:
            return op.l1 > j and bool((op.seg.gdone[:, j] >= op.t).all())
        return bool((op.seg.copied[:, j] >= op.t).all())

    def _level1(self, op: Op) -> None:
        seg, j, g = op.seg, op.l1, self.mygroup
        gi = self.groups.index(g)
        a, b = seg.split(j, len(g), g.index(self.me))
        a, b = a + seg.off(j), b + seg.off(j)
        if len(g) == 1:
            np.copyto(seg.gsum[gi, a:b], seg.inputs[g[0], a:b])
        elif b > a:
            self.rowsum([seg.inputs[r, a:b] for r in g], seg.gsum[gi, a:b], _ufunc(op))
        seg.gdone[self.me, j] = op.t
        op.l1 += 1
        self.notify(op)

    def _reduce(self, op: Op) -> None:
        seg, j = op.seg, op.red
        a, b = seg.slice(j, self.me)
        o = seg.off(j)
        dst = seg.out[a + o:b + o]
        if b > a and not (op.pre is not None and not self.two_level):
            if self.two_level:
                self.rowsum([seg.gsum[g, a + o:b + o] for g in range(len(self.groups))], dst,
                          _ufunc(op))
            else:
                self.rowsum([seg.inputs[r, a + o:b + o] for r in range(self.L)], dst, _ufunc(op))
        op.red += 1
        if op.red == seg.C:
            op.t_red = time.monotonic()
        if not self.network or b == a:
            if op.average and self.size > 1 and b > a:
                if dst.dtype.kind == "f":
                    np.divide(dst, self.size, out=dst)
                else:
                    np.floor_divide(dst, self.size, out=dst)
            seg.done[self.me, j] = op.t
        elif self.mode == "slice":
            self._submit_net(op, self.me, j, a, b)
            return
        else:
            seg.reduced[self.me, j] = op.t
        self.notify(op)

    def _net_ready(self, op: Op) -> bool:
        j, k = divmod(op.net, self.L)
        a, b = op.seg.slice(j, k)
        return b == a or op.seg.reduced[k, j] >= op.t

    def _root_net(self, op: Op) -> None:
        j, k = divmod(op.net, self.L)
        op.net += 1
        a, b = op.seg.slice(j, k)
        if b > a:
            self._submit_net(op, k, j, a, b)

    def _submit_net(self, op: Op, k: int, j: int, a: int, b: int) -> None:
        st = op.slices[k]
        err = self.engine.key_errors.get(st.key)
        if err:
            return self.fail(op, BytePSError(err))
        o = op.seg.off(j)
        view = op.seg.out[a + o:b + o]
        h = Handle(0, st, view, 1, op.average,
                   on_done=lambda h, op=op, k=k, j=j: self.net_done(NetDone(op, k, j, h)))
        task = Task(h, j, 0, b - a, (st.key + j) % self.nservers, op.net_round, view, op.prio,
                    op.seq, comp=None if op.raw else comp_pipeline(st, j, b - a))
        if op.seg.C > 1:
            self.engine.submit([task])
        else:
            self.out_tasks.append(task)          # small tensors: one Engine wake-up per pass

    def _gather(self, op: Op) -> None:
        seg, j = op.seg, op.gather
        a, b = seg.chunk_range(j)
        o = seg.off(j)
        if op.value is not None:         # asynchronous, one host: the value is kept here
            np.add(op.value[a:b], seg.out[a + o:b + o], out=op.value[a:b])
            op.out[a:b] = op.value[a:b]
        else:
            op.out[a:b] = seg.out[a + o:b + o]
        op.gather += 1
        if seg.windowed:                 # frees the slot of chunk j + W
            seg.gathered[self.me, j] = op.t
            self.notify(op)
        if op.gather == op.seg.C:
            h, now = op.handle, time.monotonic()
            self.speed.add(op.out.nbytes, now)
            self.speed.op_done(now - h.t0)
            tl = self.engine.timeline
            if tl is not None and tl.traced(h.id):
                tl.span("local reduce-scatter", h.t0, op.t_red or now, cat="local",
                        tensor=op.tensor.name, host=self.host_id)
                tl.span("network + all-gather", op.t_red or now, now, cat="local",
                        tensor=op.tensor.name, host=self.host_id)
                tl.handle_done(h, now)
            op.tensor.busy = None
            h.done()

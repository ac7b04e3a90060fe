"""Autotune's cuts of the local reduction (:class:`Cuts`, which
:class:`byteps.core.local.reducer.LocalReducer` keeps as its ``cuts``; docs/scaling.md,
"Autotune").

The tuned partition size is the reducer's chunk size.  Every local rank reads the same
setting at the same step boundary, so the n-th push of a tensor is cut alike on every
local rank and host; a cut other than the initial one has its own layout key (autotune's
:func:`~byteps.core.autotune.layout_key` of the tensor's key): a fresh shared segment
here and fresh slice keys on the servers.  At the first push in a new cut the old
segment goes and compressor state moves per element; after autotune's final choice the
slice keys of the cuts left behind are handed to the servers to free
(:meth:`Cuts.old_slice_keys`, called by byteps/core/autotune/retire.py).
"""
from __future__ import annotations

from byteps.core.engine import comp_pipeline
from byteps.core.local.shm import Segment


class Cuts:
    """How this local rank (``me`` of ``L``; ``mode``: ``root`` or ``slice``; ``network``:
    other hosts take part) cuts each tensor.  ``cfg0``: the initial settings; ``cfg()``:
    the current ones (autotune's partition size).  The reducer's ``segs`` and
    ``slice_cache`` (by layout key) lose a tensor's old layout at a re-cut;
    ``slices(tensor, seg, lkey, nbytes, cut)`` makes the new slices.  ``layouts``: tensor
    name -> layout key of its last push; ``used``: tensor name -> (its key, bytes,
    {layout key: cut})."""

    def __init__(self, cfg0, cfg, network: bool, mode: str, me: int, L: int, segs: dict,
                 slice_cache: dict, slices):
        self.cfg0, self.cfg, self.network, self.mode, self.me, self.L = \
            cfg0, cfg, network, mode, me, L
        self.segs, self.slice_cache, self.slices = segs, slice_cache, slices
        self.layouts: dict[str, int] = {}
        self.used: dict[str, tuple] = {}

    def pushed(self, tensor, lkey: int, seg: Segment, nbytes: int, cut: int) -> None:
        """User thread, at a push of ``tensor`` cut into ``cut``-byte chunks (``lkey``)."""
        prev = self.layouts.get(tensor.name)
        if prev == lkey:
            return
        self.layouts[tensor.name] = lkey
        self.used.setdefault(tensor.name, (tensor.key, nbytes, {}))[2][lkey] = cut
        if prev is not None:
            self._recut(tensor, prev, lkey, seg, nbytes, cut)

    def held(self, name: str) -> list:
        """``(first element, pipeline)`` of each compressed slice chunk of tensor
        ``name``'s current cut that this local rank pushes for its host (root mode: local
        rank 0 pushes them all; slice mode: its own slice)."""
        lkey = self.layouts.get(name)
        seg = self.segs.get(lkey)
        return [] if seg is None else _held(seg, self.slice_cache.get(lkey) or [])

    def old_slice_keys(self) -> list:
        """After autotune's final choice (user thread, at a step boundary): the slice keys
        of every cut a tensor left for good -- for each tensor whose last push already
        used the final cut (none of its older cuts can be in flight), those of its other
        cuts (every local rank's slices: in ``slice`` mode each local rank votes for all).
        A tensor not pushed since the choice is looked at again at a later boundary."""
        from byteps.core.api import tensor_key
        out = []
        for name, (key, nbytes, used) in self.used.items():
            cur = self.layouts.get(name)
            if len(used) < 2 or self.layout_key(key, nbytes, name, self.chunk_bytes(
                    nbytes, name)) != cur:
                continue
            for lkey, cut in list(used.items()):
                if lkey != cur:
                    del used[lkey]
                    out += [self.layout_key(tensor_key(f"{name}.slice{k}"), nbytes, name, cut)
                            for k in range(self.L)]
        return out

    def chunk_bytes(self, nbytes: int, name: str, cfg=None) -> int:
        """Bytes of one chunk of a tensor: the partition size (capped to fit a message;
        autotune's current one, or ``cfg``'s) where slices go to the servers, the initial
        one where both leave the tensor whole; BYTEPS_PARTITION_BYTES as given without a
        network stage."""
        if not self.network:
            return self.cfg0.partition_bytes
        p = (cfg or self.cfg()).partition_size(nbytes, name)
        p0 = self.cfg0.partition_size(nbytes, name)
        return p0 if nbytes <= min(p, p0) else p

    def layout_key(self, key: int, nbytes: int, name: str, cut: int) -> int:
        """The key of tensor ``name`` (``key``: its name's) cut into chunks of ``cut``
        bytes: its own for the initial cut, else autotune's layout key, which names a fresh
        shared segment here and (mixed into the slices' keys) fresh keys on the servers,
        the same on every local rank and host (docs/scaling.md, "Autotune")."""
        from byteps.core.autotune import layout_key
        p0 = self.cfg0.partition_size(nbytes, name) if self.network else cut
        return layout_key(key, cut, p0)

    def _recut(self, tensor, prev: int, lkey: int, seg: Segment, nbytes: int,
               cut: int) -> None:
        """Tensor ``tensor`` moved from layout ``prev`` to ``lkey`` (autotune, at the same
        push on every local rank; none of its operations is in flight here).  Compressor
        state moves per element from the old slices' pipelines this rank held to the new
        ones it will push (root mode: local rank 0 holds all, so all of it moves; slice
        mode: what another local rank held starts at zero); the old segment is unmapped
        and unlinked (every local rank opened it for the operation that just finished)."""
        old_seg, old_sl = self.segs.pop(prev, None), self.slice_cache.pop(prev, None)
        if getattr(tensor, "spec", None) is not None and old_sl and old_seg is not None \
                and self.network:
            from byteps.compression import carry_state
            old = _held(old_seg, old_sl)
            new_sl = self.slices(tensor, seg, lkey, nbytes, cut)
            mine = range(self.L) if self.mode == "root" and self.me == 0 else \
                (self.me,) if self.mode == "slice" else ()
            new = [(a, comp_pipeline(new_sl[k], j, b - a)) for k in mine
                   for j in range(seg.C) for a, b in (seg.slice(j, k),) if b > a]
            carry_state(old, new, seg.n)
        if old_seg is not None:
            if old_seg.created:
                old_seg.unlink()
            old_seg.close()


def _held(seg: Segment, sl: list) -> list:
    """``(first element, pipeline)`` of the slices ``sl`` of segment ``seg``."""
    return [(seg.slice(j, k)[0], p) for k, st in enumerate(sl) for j, p in st.pipes.items()]

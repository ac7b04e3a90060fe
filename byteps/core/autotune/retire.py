"""The keys of the partition sizes autotune no longer uses, freed (docs/scaling.md,
"Autotune").

During autotune's trials a tensor whose cut changes gets a new key per size
(:func:`byteps.core.autotune.layout_key`).  After the final choice (the same decision on
every rank at the same step boundary) no size is ever gone back to, so at that boundary
and at each later one, until every tensor is settled, this worker hands the keys it left
behind to its engine thread (:meth:`byteps.core.engine.Engine.retire_keys`),
which forgets its own state of them (declarations sent, shared-memory segments) and sends
``FREE`` to every server.  A key is handed over only after this worker's last use of it:

* at the boundary, every tensor with no handle in flight is re-cut to the chosen size at
  once (what its next push would do), so it is on its final key;
* the keys it moved away from (autotune's ``saved`` rounds) are handed over; those of a
  tensor still in flight wait until it is re-cut at a later boundary (one of them may be
  its final key, whose rounds continue there).

A server frees a key once every pushing rank asked (byteps/server/retire.py), so a key one
rank still uses is never freed.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("byteps.autotune")


class Retirer:
    """What this worker has retired (sent to its engine) and what it must retry."""

    def __init__(self):
        self.done: set = set()          # keys handed to the engine (never twice)
        self.retry: list = []           # keys the engine found queued or in flight
        self.settled = False            # every tensor is on its final key (or retired)
        self.lock = threading.Lock()
        self.count = 0

    def again(self, keys: list) -> None:
        """Engine thread: these keys still had partitions queued or in flight."""
        with self.lock:
            self.retry.extend(keys)
            self.done.difference_update(keys)


def at_boundary(st) -> None:
    """A step boundary after autotune's final choice (called by autotune.boundary): re-cut
    every idle tensor now (as its next push would: :func:`byteps.core.autotune.relayout`,
    whatever it re-cuts), then hand over the keys the tensors left behind (autotune's
    ``saved`` rounds) -- except those of a tensor still in flight, which is re-cut at a
    later boundary first (its final key may be among them: its rounds continue there)."""
    from byteps.core.autotune import relayout
    tu, eng = st.tuner, st.engine
    if eng is None or eng.fatal:
        return
    r = tu.retire
    if r is None:
        r = tu.retire = Retirer()
    with r.lock:
        keys, r.retry = r.retry, []
    with st.lock:                       # push_pull_async marks a tensor busy under it
        waiting = set()
        if not r.settled:
            for t in list(st.tensors.values()):
                if t.layout != tu.layout and t.busy is None:
                    relayout(st, t, t.dtype.itemsize * _elements(t.shape))
                if t.layout != tu.layout:
                    waiting.add(t.name)         # in flight: re-cut at a later boundary
            r.settled = not waiting
        for (name, key) in list(tu.saved):
            if name not in waiting:
                del tu.saved[(name, key)]
                keys.append(key)
        if st.local is not None:        # the local reduction's slices of the cuts left
            keys += st.local.cuts.old_slice_keys()
        # a copy first: a background stage (AsyncModelAverage's thread, DiLoCo's) may
        # declare a tensor meanwhile, without st.lock
        live = {t.key for t in list(st.tensors.values())}
        keys = [k for k in dict.fromkeys(keys) if k not in r.done]
        with r.lock:
            r.retry += [k for k in keys if k in live]        # in use (a name-hash clash)
        keys = [k for k in keys if k not in live]
        r.done.update(keys)
    if keys:
        r.count += len(keys)
        log.debug("autotune (rank %d, step %d): freeing %d key(s) of partition sizes no "
                  "longer used", st.rank, tu.step, len(keys))
        eng.request(("retire", (keys, r.again)))


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n

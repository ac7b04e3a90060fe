"""The local ranks of a host leave a global barrier together.

Every rank meets the scheduler's barrier on its own, and the scheduler releases them all at
once; but the local ranks of a host see the results of their push_pulls one hand-off apart
(the network client, local rank 0, gets each result first and hands it to the others over
shared memory).  So a script that times a barrier from the result of the allreduce before
it (Horovod's ``test_global_barrier_op``: rank 0 sleeps 5 s, every rank measures its
barrier's time from its allreduce's result and expects at least 5 s) saw a non-root local
rank measure a few milliseconds too little: it got its allreduce one hand-off later than
rank 0, and the barrier's release no later.

After the scheduler's barrier, each local rank tells the others that it has passed
barrier ``k`` (a 17-byte message on the local reduction's ``ipc://`` sockets) and waits
until every other local rank has, so every local rank leaves the barrier one hand-off
after the last one released, as it gets its results.  A local rank inside ``join()``
counts as present in barriers (as on the scheduler): nobody waits for it, and the counts
start again after every ``join()`` (as the barriers' names do), so they are counted per
``join()`` generation.  The barrier itself is already complete, so this wait is bounded
(:data:`BOUND_S`): a local rank that died or left meanwhile costs at most that, never a
hang.
"""
from __future__ import annotations

import collections
import logging
import struct
import threading
import time

import zmq

log = logging.getLogger("byteps.local")
BOUND_S = 1.0
_MSG = struct.Struct("<ciiq")         # b"B", sender's local rank, join generation, count
TAG = b"B"


class BarrierSettle:
    """One per :class:`~byteps.core.local.reducer.LocalReducer` (a membership's local
    ranks count their global barriers alike: the reducer is new at every ``init()``)."""

    def __init__(self, local_size: int, me: int):
        self.me = me
        self.seen = {r: (0, 0) for r in range(local_size) if r != me}
        self.gen, self.k = 0, 0
        self.out: collections.deque = collections.deque()
        self.cond = threading.Condition()

    def passed(self, wake, gen: int = 0, joined=None) -> None:
        """User thread, after the scheduler's barrier: announce it (``wake()`` gets the
        local thread to :meth:`flush`) and wait for the other local ranks' word.  ``gen``:
        this rank's ``join()`` count; ``joined``: the local ranks' ``join()`` counts (the
        shared flags of :mod:`.join`), a rank ahead of ``gen`` is inside ``join()``."""
        if not self.seen:
            return
        if gen != self.gen:
            self.gen, self.k = gen, 0
        self.k += 1
        mine = (gen, self.k)
        self.out.append(mine)
        wake()
        end = time.monotonic() + BOUND_S

        def late():
            return [r for r, got in self.seen.items()
                    if got < mine and not (joined is not None and joined[r] > gen)]
        with self.cond:
            while late():
                left = end - time.monotonic()
                if left <= 0:
                    log.debug("barrier %s: local rank(s) %s not heard from within %.1f s",
                              mine, late(), BOUND_S)
                    return
                self.cond.wait(min(left, 0.05))     # (a rank may join meanwhile)

    def flush(self, push: dict) -> None:
        """Local thread (which owns the sockets): send what :meth:`passed` queued."""
        while self.out:
            msg = _MSG.pack(TAG, self.me, *self.out.popleft())
            for s in push.values():
                try:
                    s.send(msg, zmq.NOBLOCK)
                except zmq.Again:
                    pass

    def got(self, msg: bytes) -> bool:
        """Local thread: take a peer's message; False when ``msg`` is not one (or malformed)."""
        if len(msg) != _MSG.size or msg[:1] != TAG:
            return False
        _, rank, gen, k = _MSG.unpack(msg)
        with self.cond:
            if rank in self.seen and (gen, k) > self.seen[rank]:
                self.seen[rank] = (gen, k)
                self.cond.notify_all()
        return True

"""``join()`` under local reduction (docs/local_reduction.md, "join").

A local rank that called ``join()`` keeps its part of the host's local reduction: for
every push_pull that another local rank of its host starts, it contributes zeros (its
reduction thread makes the operation itself, from the tensor it has pushed before), so
the host's sum is the sum over its ranks that still have data, and the network client
(the local root, or each slice's rank) keeps pushing for the host.  The servers count a
host as joined only when every one of its local ranks has
(:func:`byteps.server.store.counted_joined`).

The local ranks of a host tell each other that they joined through a small shared file
``<prefix>joined`` (one int64 per local rank: how many times it called ``join()``).  A
joined rank stops adding zeros as soon as every local rank of its host has joined: then
no operation of the current ``join()`` can start any more (a rank joins only after its
own operations finished), and the next ones, after ``JOIN_DONE``, are everyone's again.

After ``join()`` the servers start every key's rounds at 0 again, while the counters in
the shared segments keep counting: the network round of a slice is its local round
minus the local round at the last ``join()`` (:attr:`JoinState.base`), the same on every
host.
"""
from __future__ import annotations

import logging
import mmap
import os

import numpy as np

log = logging.getLogger("byteps.local")


class JoinFlags:
    """The shared ``joined`` counters of one host's local ranks."""

    def __init__(self, path: str, local_size: int):
        self.path, self.L = path, local_size
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < local_size * 8:
                os.ftruncate(fd, local_size * 8)     # zeros; idempotent on every rank
            self.mm = mmap.mmap(fd, local_size * 8)
        finally:
            os.close(fd)
        self.count = np.frombuffer(self.mm, np.int64, local_size)

    def mark(self, me: int, gen: int) -> None:
        self.count[me] = gen

    def all_joined(self, gen: int) -> bool:
        return bool((self.count >= gen).all())

    def close(self) -> None:
        self.count = None
        try:
            self.mm.close()
        except (BufferError, AttributeError):
            pass

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class JoinState:
    """One local rank's side of ``join()``: its generation, whether it adds zeros, what
    it knows of every tensor it pushed (to make a zero contribution to it) and the
    network rounds' base after each ``join()``."""

    def __init__(self, path: str, local_size: int):
        self.flags = JoinFlags(path, local_size)
        self.gen = 0
        self.zeros = False       # this rank joined: it adds zeros to its host's operations
        self.known: dict[int, tuple] = {}    # name key -> (tensor, average) of its last push
        self.base: dict[int, int] = {}       # layout key -> local round at the last join()
        self.failed: set[int] = set()        # keys it could not add zeros to (logged)

    def net_round(self, lkey: int, rnd: int) -> int:
        return rnd - self.base.get(lkey, 0)

    def begin(self, me: int) -> None:
        """User thread: this rank joined (its own operations have finished)."""
        self.gen += 1
        self.flags.mark(me, self.gen)
        self.zeros = True

    def end(self, rounds: dict) -> None:
        """User thread: ``join()`` returned (every rank joined; the servers reset their
        rounds): network rounds start at 0 again from the local rounds reached now."""
        self.zeros = False
        self.base = dict(rounds)

    def done(self) -> bool:
        """Whether this rank adds no zeros (any more): not joined, or every local rank of
        its host has joined the current ``join()`` (the others may already be training
        again, under tensor names this rank has not pushed yet)."""
        return not self.zeros or self.flags.all_joined(self.gen)

    def wanted(self, seg, me: int, rnd: int) -> bool:
        """Whether another local rank has started round ``rnd`` of ``seg`` (this rank's
        next), which this joined rank must add zeros to."""
        if self.done():
            return False
        started = seg.copied[:, 0] >= rnd + 1
        started[me] = False
        return bool(started.any())

    def close(self, unlink: bool) -> None:
        self.flags.close()
        if unlink:
            self.flags.unlink()

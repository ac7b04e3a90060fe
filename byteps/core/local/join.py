"""``join()`` under local reduction (docs/local_reduction.md, "join").

A local rank that called ``join()`` keeps its part of the host's local reduction: for
every push_pull that another local rank of its host starts, it contributes zeros (its
reduction thread makes the operation itself, from the tensor it has pushed before), so
the host's sum is the sum over its ranks that still have data, and the network client
(the local root, or each slice's rank) keeps pushing for the host.  The servers count a
host as joined only when every one of its local ranks has
(:func:`byteps.server.store.counted_joined`).

The local ranks of a host tell each other that they joined through a small shared file
``<prefix>joined`` (one int64 per local rank: how many times it called ``join()``; then
one per local rank: the partition size it cuts with now).  A rank may join while autotune
still searches; the ranks still training then switch partition sizes without it (fresh
layout keys, fresh segments), so a joined rank cuts its zeros with their current size
(:meth:`JoinFlags.training_partition`), not its own.  A
joined rank stops adding zeros as soon as every local rank of its host has joined: then
no operation of the current ``join()`` can start any more (a rank joins only after its
own operations finished), and the next ones, after ``JOIN_DONE``, are everyone's again.

After ``join()`` the servers start every key's rounds at 0 again, while the counters in
the shared segments keep counting: the network round of a slice is its local round
minus the local round at the last ``join()`` (:attr:`JoinState.base`), the same on every
host.

A joined rank can add zeros to a tensor it never pushed itself (Horovod's join tests: a
rank joins at once while the others push new names; AsyncModelAverage's background
rounds, which may not have run on a rank that joins early): the first local rank to push
a tensor writes its name, shape, dtype, op, average flag, compression and whether it is
asynchronous to ``<prefix>n<key>`` (:func:`note`, JSON, validated field by field when
read, :func:`learn`), and the joined rank declares the tensor from it.
"""
from __future__ import annotations

import json
import logging
import mmap
import os

import numpy as np

log = logging.getLogger("byteps.local")


_DTYPES = {np.dtype(t).str: np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64)}


def note(path: str, tensor, average: bool, src: np.ndarray) -> None:
    """Write, once per host, what a joined local rank needs to add zeros to ``tensor``:
    its shape, dtype, op, average flag, compression (the spec's wire form) and whether it
    is asynchronous."""
    if os.path.exists(path) or src.dtype.str not in _DTYPES:
        return
    from byteps.transport.wire import ASYNC
    body = json.dumps({"name": tensor.name, "shape": list(src.shape), "dtype": src.dtype.str,
                       "op": int(tensor.op), "average": bool(average),
                       "spec": None if tensor.asked is None else tensor.asked.to_wire(),
                       "async": bool(tensor.wire_flags & ASYNC)})
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except OSError as exc:          # a full /dev/shm: join falls back to known tensors
        log.debug("cannot write %s: %s", path, exc)


def learn(path: str) -> tuple | None:
    """(name, shape, dtype, op, average, spec, asynchronous) from :func:`note`'s file,
    checked field by field (the spec by ``Spec.from_wire``); None when there is none or it
    is malformed."""
    from byteps.compression.spec import Spec
    try:
        with open(path) as f:
            d = json.loads(f.read(65536))
        name, shape, dt, op, avg = d["name"], d["shape"], d["dtype"], d["op"], d["average"]
        spec, asy = d["spec"], d["async"]
        if spec is not None:
            spec = Spec.from_wire(spec, f"the join note {path}")
    except (OSError, ValueError, KeyError, TypeError):     # CompressionError: a ValueError
        return None
    if not (isinstance(name, str) and 0 < len(name) <= 4096 and isinstance(shape, list)
            and len(shape) <= 32 and all(type(x) is int and 0 <= x < 1 << 40 for x in shape)
            and dt in _DTYPES and type(op) is int and 0 <= op <= 3 and type(avg) is bool
            and type(asy) is bool):
        return None
    return name, tuple(shape), _DTYPES[dt], op, avg, spec, asy


class JoinFlags:
    """The shared ``joined`` counters of one host's local ranks, and each one's partition
    size (autotune's, as its reducer cuts with it now)."""

    def __init__(self, path: str, local_size: int):
        self.path, self.L = path, local_size
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < 2 * local_size * 8:
                os.ftruncate(fd, 2 * local_size * 8)     # zeros; idempotent on every rank
            self.mm = mmap.mmap(fd, 2 * local_size * 8)
        finally:
            os.close(fd)
        self.count = np.frombuffer(self.mm, np.int64, local_size)
        self.part = np.frombuffer(self.mm, np.int64, local_size, local_size * 8)

    def mark(self, me: int, gen: int) -> None:
        self.count[me] = gen

    def all_joined(self, gen: int) -> bool:
        return bool((self.count >= gen).all())

    def publish(self, me: int, partition_bytes: int) -> None:
        self.part[me] = partition_bytes

    def training_partition(self, me: int, gen: int) -> int | None:
        """The partition size of a local rank that has not joined ``join()`` number
        ``gen`` (None: none, or not known).  The ranks still training switch sizes at the
        same step (autotune: their step counts agree; a joined rank's stopped), so a
        joined rank cuts its zeros as they do now, not as it did when it joined."""
        for r in range(self.L):
            if r != me and self.count[r] < gen and self.part[r] > 0:
                return int(self.part[r])
        return None

    def close(self) -> None:
        self.count = self.part = None
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
        self.unseen: set[int] = set()        # keys other local ranks started, not in known

    def saw(self, keys) -> None:
        """Keys other local ranks announced: one not in :attr:`known` (a tensor this rank
        never pushed) stays a candidate for zeros even when it came before this rank
        joined."""
        if len(self.unseen) < 65536:
            self.unseen.update(k for k in keys if k not in self.known)

    def candidates(self) -> set:
        """Every key this joined rank may owe zeros to: what it pushed, what it saw."""
        self.unseen.difference_update(self.known)
        return set(self.known) | self.unseen

    def learn(self, folder: str, prefix: str, key: int):
        """A tensor this joined rank never pushed, declared from its :func:`note`:
        ``(tensor, average, shape, dtype)`` as :attr:`known` keeps, or None."""
        got = learn(os.path.join(folder, f"{prefix}n{key:016x}"))
        if got is None:
            return None
        from byteps.common.errors import BytePSError
        from byteps.core import state as _st
        from byteps.core.pipeline.tensors import _tensor
        name, shape, dtype, op, average, spec, asynchronous = got
        st = _st.current()
        if spec is not None and name not in st.tensors:
            st.declared.setdefault(name, spec)     # as api.declare(name, its params)
        try:
            tensor = _tensor(st, name, np.zeros(shape, dtype), None, op)
        except BytePSError:
            return None
        if tensor.key != key or tensor.asked != spec:
            return None
        from byteps.transport.wire import ASYNC
        if asynchronous:
            tensor.wire_flags |= ASYNC           # as its first asynchronous push does
        elif tensor.wire_flags & ASYNC:
            return None
        self.known[key] = (tensor, average, shape, dtype)
        return self.known[key]

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

"""The worker engine's units of work: a :class:`Handle` per push_pull, a :class:`Task` per
partition.  ``byteps.core.engine`` re-exports both."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from byteps.common.errors import BytePSError


class Handle:
    """An asynchronous push_pull; done when every partition has come back.  ``on_done``
    (optional) is called with the handle, on the engine thread, once it completed or
    failed (``error`` set).  ``hvd``: its record in Horovod's timeline (hvd_timeline.py),
    written before the waiters wake."""
    __slots__ = ("id", "tensor", "out", "remaining", "average", "error", "event", "t0",
                 "flat_out", "on_done", "hvd")

    def __init__(self, hid: int, tensor, out: np.ndarray, nparts: int, average: bool,
                 on_done: Callable[[Handle], None] | None = None):
        self.id, self.tensor, self.out = hid, tensor, out
        self.flat_out = out.reshape(-1)
        self.remaining, self.average = nparts, average
        self.error: BytePSError | None = None
        self.event = threading.Event()
        self.t0 = time.monotonic()
        self.on_done = on_done
        self.hvd = None

    def done(self) -> None:
        """Completed (or failed, with ``error`` set): wake its waiters, then ``on_done``."""
        if self.hvd is not None:
            self.hvd.finish(self)
        self.event.set()
        if self.on_done is not None:
            self.on_done(self)


class Task:
    __slots__ = ("prio", "seq", "handle", "part", "start", "length", "server", "round", "src",
                 "nbytes", "sent_at", "acked", "tries", "comp", "wire", "order", "credit")

    def __init__(self, handle: Handle, part: int, start: int, length: int, server: int,
                 round: int, src: np.ndarray, prio: int, seq: int, order: int = 0, comp=None):
        """Partition ``part`` of ``handle``'s tensor: its elements ``[start, start + length)``
        (``src``), round ``round``, for server index ``server``; the heap takes tasks by
        (prio, seq, order, part), the same on every rank."""
        self.handle, self.part, self.start, self.length = handle, part, start, length
        self.server, self.round, self.src = server, round, src
        self.prio, self.seq = prio, seq
        self.comp = comp     # compression pipeline of this partition (byteps.compression)
        self.wire = None     # its compressed frame, made once (resends reuse it)
        self.order = order   # position within its tensor (api: rotated per rank, incast)
        self.nbytes = src.nbytes if comp is None else comp.frame_bytes   # bytes it sends
        self.credit = 0      # bytes of the credit window it holds (Engine.dispatch)
        self.sent_at, self.acked, self.tries = 0.0, False, 0

    def __lt__(self, other: "Task") -> bool:
        # a total order (priority, submission, position in the tensor)
        return (self.prio, self.seq, self.order, self.part) < \
            (other.prio, other.seq, other.order, other.part)

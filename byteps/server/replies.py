"""A server's replies to workers (:class:`Replies`, held by ``Server``).

Only the I/O thread writes to the ROUTER socket.  Engine threads and membership changes
queue what they have (:meth:`Replies.queue`, :meth:`Replies.error`) and wake the I/O
thread through a pipe; the I/O thread sends the queue (:meth:`Replies.flush`) after each
poll.  While the I/O thread receives a burst of messages (:meth:`Replies.burst`), the acks
and inline results it produces are gathered and leave as one RESULT message per worker.
Results wait for the backup server where there is one (``replica.hold``).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os

import zmq

from byteps import transport
from byteps.transport.wire import SHM, Op, encode, new_seq

log = logging.getLogger("byteps.server")


def frame(slots: dict, e, a):
    """What to send for the result ``a`` of entry ``e``: a partition's own result buffer
    (``slot.bufs``, double-buffered by round parity) as a ``zmq.Frame`` made once and sent
    again every round, anything else as it is.  pyzmq registers every zero-copy send of an
    array with its garbage-collector thread, which libzmq's I/O thread wakes once the frame
    is sent; a Frame sent again shares its data by reference count, so neither happens
    (256 KB results: 30-57 us of that thread per round, one registration per worker).
    Rewriting a buffer while it is being sent is ruled out as before: round r + 2 starts
    only after every worker received round r."""
    slot = slots.get((e.key, e.part))
    bufs = slot.bufs if slot is not None else None
    if bufs is None or (a is not bufs[0] and a is not bufs[1]) or a.nbytes < ZERO_COPY_MIN:
        return a
    for buf, f in slot.frames or ():
        if buf is a:
            return f
    f = zmq.Frame(a, copy=False)
    slot.frames = [(a, f)] + (slot.frames or [])[:1]
    return f


ZERO_COPY_MIN = 65536     # smaller arrays are copied by pyzmq anyway (zmq.COPY_THRESHOLD)


class Replies:
    def __init__(self, srv):
        self.srv = srv
        self.seq = new_seq()
        self.batch: dict | None = None        # replies gathered while a burst is received
        self.outbox: collections.deque = collections.deque()
        self.wake_r, self.wake_w = os.pipe()  # an engine thread queued something
        os.set_blocking(self.wake_w, False)

    # ---------------------------------------------------------------- I/O thread
    def send(self, ident: bytes, op: int, body, payload=()) -> None:
        srv = self.srv
        self.seq += 1
        msg = [ident] + encode(srv.cfg.job_id, srv.link.node_id, op, srv.link.epoch,
                               self.seq, body, srv.secret) + list(payload)
        try:
            transport.send_frames(srv.sock, msg)
        except zmq.ZMQError as exc:
            log.debug("cannot reach worker: %s", exc)

    def results(self, out: dict) -> None:
        """Send ``out`` (worker identity -> [(entry, array or None)]) as RESULT messages."""
        out = self.srv.replica.hold(out)      # results wait until the backup has their round
        slots = self.srv.slots
        for ident, items in out.items():
            frames = [frame(slots, e, a) for e, a in items if a is not None and not e.flags & SHM]
            self.send(ident, Op.RESULT, [[e for e, _ in items], []], frames)

    def deliver(self, out: dict) -> None:
        """The I/O thread's own results: gathered during a burst, else sent now."""
        if self.batch is None:
            return self.results(out)
        for ident, items in out.items():
            self.batch.setdefault(ident, []).extend(items)

    @contextlib.contextmanager
    def burst(self):
        """Receive a burst of messages; their replies leave together at the end."""
        self.batch = {}
        try:
            yield
        finally:
            batch, self.batch = self.batch, None
            if batch:
                self.results(batch)

    def woken(self) -> None:
        os.read(self.wake_r, 4096)

    def flush(self) -> None:
        while self.outbox:
            item = self.outbox.popleft()
            if isinstance(item, tuple):      # (worker identity, DATA_ERROR body)
                self.send(item[0], Op.DATA_ERROR, item[1])
            else:
                self.results(item)

    # ---------------------------------------------------------------- any thread
    def queue(self, out: dict) -> None:
        """Results computed off the I/O thread, sent by it."""
        self.outbox.append(out)
        self.wake()

    def error(self, ident: bytes, body: dict) -> None:
        """A DATA_ERROR for one worker, sent by the I/O thread."""
        self.outbox.append((ident, body))
        self.wake()

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

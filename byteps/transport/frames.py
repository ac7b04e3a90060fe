"""Zero-copy frames kept for buffers that are sent again and again.

pyzmq registers every zero-copy send of an array (``copy=False``) with its garbage-collector
thread: libzmq's I/O thread, once it has written the message, sends the array's id over an
inproc socket, which wakes that thread, which takes the GIL to drop the reference.  A
worker pushes each partition from the same tensor every step, so that is one more thread
wake-up and GIL hand-off per partition sent.  A ``zmq.Frame`` made once and sent again
shares its data by reference count (pyzmq's ``fast_copy``): none of that happens.

:class:`SentFrames` keeps one frame per key (a partition) for a buffer seen at the same
address and size twice in a row; a buffer at another address drops it.  The frame holds
a reference to the array, so its memory cannot be freed and reused by another buffer
while it is kept: the address names the same bytes.  Sending reads the buffer's current
contents, as a zero-copy send always did; the caller must not write a buffer while it is
being sent (a worker's push of round r is complete, acknowledged, before round r + 1 of
the partition is pushed).  A job that passes a new array every step keeps at most one
previous array per partition alive until its next push.
"""
from __future__ import annotations

import zmq

COPY_MAX = 65536       # smaller buffers are copied by pyzmq anyway (zmq.COPY_THRESHOLD)


class SentFrames:
    """``get(key, arr)``: what to send for ``arr`` (a C-contiguous numpy array) pushed under
    ``key``: a kept ``zmq.Frame`` or ``arr`` itself."""

    __slots__ = ("kept",)

    def __init__(self):
        self.kept: dict = {}    # key -> (address, nbytes, zmq.Frame or None)

    def get(self, key, arr):
        n = arr.nbytes
        if n < COPY_MAX:
            return arr
        addr = arr.__array_interface__["data"][0]
        got = self.kept.get(key)
        if got is not None and got[0] == addr and got[1] == n:
            f = got[2]
            if f is None:            # the same buffer a second time: keep a frame of it
                f = zmq.Frame(arr, copy=False)
                self.kept[key] = (addr, n, f)
            return f
        self.kept[key] = (addr, n, None)     # a new buffer (the old frame is released)
        return arr

    def forget(self, keep) -> None:
        """Release the frames of the keys for which ``keep(key)`` is false."""
        for k in [k for k in self.kept if not keep(k)]:
            del self.kept[k]

    def clear(self) -> None:
        self.kept.clear()

    def __len__(self) -> int:
        return sum(1 for v in self.kept.values() if v[2] is not None)

"""transport.frames.SentFrames: a push sent again from the same buffer goes out as one kept
zero-copy frame (no pyzmq garbage-collector round trip per send), with the buffer's current
contents; another buffer drops it."""
import numpy as np
import zmq
from zmq.utils.garbage import gc

from byteps import transport
from byteps.transport.frames import COPY_MAX, SentFrames


def test_kept_only_for_the_same_buffer_twice():
    sf = SentFrames()
    a = np.arange(COPY_MAX // 4 * 2, dtype=np.float32)
    assert sf.get("k", a) is a                      # first time: sent as it is
    f = sf.get("k", a)
    assert isinstance(f, zmq.Frame) and len(sf) == 1
    assert sf.get("k", a[:]) is f                   # another view of the same bytes
    b = a.copy()
    assert sf.get("k", b) is b and len(sf) == 0     # a new buffer releases the frame
    assert sf.get("k", a[1:]) is not f              # other bytes (shifted view)
    small = np.zeros(16, np.float32)
    assert sf.get("s", small) is small and sf.get("s", small) is small
    sf.get("k", b)
    sf.get("k", b)
    sf.get("j", a)
    sf.get("j", a)
    assert len(sf) == 2
    sf.forget(lambda k: k != "k")
    assert len(sf) == 1 and set(sf.kept) == {"j"}
    sf.clear()
    assert len(sf) == 0


def test_kept_frame_sends_current_contents_without_gc_registrations():
    ctx = zmq.Context()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = r.bind_to_random_port("tcp://127.0.0.1")
        d.connect(f"tcp://127.0.0.1:{port}")
        a = np.zeros(1 << 18, np.float32)
        sf = SentFrames()
        got = []
        for i in range(6):
            a[:] = i                                  # the caller writes between sends
            before = len(gc.refs)
            transport.send_frames(d, [b"h", sf.get("k", a)])
            frames = transport.recv_frames(r)
            got.append(np.frombuffer(frames[2].buffer, np.float32))
            if i >= 2:                                # the kept frame: nothing registered
                assert len(gc.refs) <= before
        for i, g in enumerate(got):
            assert g.shape == a.shape and (g == i).all()
    finally:
        r.close(0)
        d.close(0)
        ctx.term()

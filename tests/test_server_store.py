"""The summation store's averaging (wire.AVG): a round whose every push asks for the
average is divided on the server with the workers' own rule, and its results say so."""
from __future__ import annotations

import numpy as np

from byteps.server.store import Slot, apply
from byteps.transport.wire import AVG, PULL, PUSH, Entry, average


def _round(flags: list[int], dtype=np.float32, size: int = 3, code: int = 0):
    slot = Slot(7, 0, code, 4, -1)
    out: dict = {}
    for rank, f in enumerate(flags):
        arr = np.full(4, rank + 1, dtype)
        apply(slot, Entry(7, 0, 0, PUSH | PULL | f, code, 4), arr, rank, b"w%d" % rank,
              len(flags), out, size=size)
    return {k: v[-1] for k, v in out.items()}     # each worker's result (entry, array)


def test_every_push_averaged_is_divided_on_the_server():
    res = _round([AVG, AVG, AVG])
    want = np.empty(4, np.float32)
    average(np.full(4, 6, np.float32), 3, want)
    for entry, arr in res.values():
        assert entry[3] & AVG and entry[3] & PULL
        np.testing.assert_array_equal(arr, want)      # the same bits the worker would make


def test_a_push_without_avg_or_an_integer_round_stays_a_sum():
    for entry, arr in _round([AVG, 0, AVG]).values():
        assert not entry[3] & AVG
        np.testing.assert_array_equal(arr, np.full(4, 6, np.float32))
    for entry, arr in _round([AVG] * 3, np.int32, code=3).values():
        assert not entry[3] & AVG
        np.testing.assert_array_equal(arr, np.full(4, 6, np.int32))
    for entry, arr in _round([AVG] * 3, size=0).values():     # e.g. a backup keeps sums
        assert not entry[3] & AVG


def test_a_single_pusher_is_averaged_into_the_servers_buffer():
    slot = Slot(7, 0, 0, 4, -1)
    out: dict = {}
    pushed = np.full(4, 8, np.float32)
    apply(slot, Entry(7, 0, 0, PUSH | PULL | AVG, 0, 4), pushed, 0, b"w0", 1, out, size=4)
    (entry, arr), = out[b"w0"]
    assert entry[3] & AVG and arr is not pushed
    np.testing.assert_array_equal(arr, np.full(4, 2, np.float32))
    np.testing.assert_array_equal(pushed, np.full(4, 8, np.float32))   # untouched


def test_results_from_a_slots_buffers_are_sent_as_one_reused_frame():
    """server/replies.frame: a round's result in the partition's own buffer leaves as a
    zmq.Frame made once per buffer; the frame shares the buffer (the next round's sum is
    what arrives, not a stale copy); other arrays and small ones are sent as they are."""
    import zmq

    from byteps.server.replies import frame
    n = 1 << 16                                    # 256 KB of float32
    slot = Slot(7, 0, 0, n, -1)
    out: dict = {}
    for rnd in range(3):
        for rank in (0, 1):
            apply(slot, Entry(7, 0, rnd, PUSH | PULL, 0, n), np.full(n, rank + rnd, np.float32),
                  rank, b"w%d" % rank, 2, out)
    results = [(e, a) for items in out.values() for e, a in items]
    slots = {(7, 0): slot}
    frames = [frame(slots, e, a) for e, a in results]
    assert all(isinstance(f, zmq.Frame) for f in frames)
    assert len({id(f) for f in frames}) == 2          # one per buffer (round parity)
    assert len(slot.frames) == 2
    other = np.ones(n, np.float32)
    assert frame(slots, results[0][0], other) is other
    small = Slot(8, 0, 0, 16, -1)
    small.bufs = [np.ones(16, np.float32), np.ones(16, np.float32)]
    assert frame({(8, 0): small}, Entry(8, 0, 0, PULL, 0, 16), small.bufs[0]) is small.bufs[0]
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        b.connect(f"tcp://127.0.0.1:{a.bind_to_random_port('tcp://127.0.0.1')}")
        buf = slot.bufs[0]
        for value in (5.0, 9.0):                      # the sum of a later round, same buffer
            buf[:] = value
            a.send(frame(slots, results[0][0], buf), copy=False)
            assert b.poll(5000)
            got = np.frombuffer(b.recv(), np.float32)
            assert got.shape == (n,) and np.all(got == value)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_a_nonfinite_push_makes_that_round_nonfinite_for_every_worker_only():
    """wire.NONFINITE: a compressed push whose partition held inf or NaN (an empty frame)
    counts as a push of NaN: every worker's result of that round is an empty NONFINITE
    frame, whatever the arrival order; the server's compressor state is left as it was,
    so the next round's frame is the one a server that never saw that round makes."""
    from byteps.compression import parse, server_pipeline, worker_pipeline
    from byteps.transport.wire import COMP, NONFINITE
    spec, n = parse({"compressor": "onebit", "ef": "vanilla"}), 64
    frames = [worker_pipeline(spec, n, 7, 0).compress(np.full(n, r + 1.0, np.float32), 0)
              for r in range(3)]
    empty = np.empty(0, np.uint8)

    def rounds(slot, first: list, order):
        out: dict = {}
        for rnd, pushes in ((0, first), (1, frames)):
            for r in order:
                f = pushes[r]
                flags = PUSH | PULL | COMP | (NONFINITE if f is empty else 0)
                apply(slot, Entry(7, 0, rnd, flags, 0, n), f, r, b"w%d" % r, 3, out)
        return out

    for order in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
        slot = Slot(7, 0, 0, n, -1, server_pipeline(spec, n, 7, 0))
        out = rounds(slot, [frames[0], empty, frames[2]], order)
        ref = Slot(7, 0, 0, n, -1, server_pipeline(spec, n, 7, 0))
        ref_out: dict = {}
        for r in order:
            apply(ref, Entry(7, 0, 1, PUSH | PULL | COMP, 0, n), frames[r], r, b"w%d" % r, 3,
                  ref_out)
        for w in (b"w0", b"w1", b"w2"):
            (e0, a0), (e1, a1) = [x for x in out[w] if x[1] is not None]
            assert e0.round == 0 and e0.flags & NONFINITE and e0.flags & COMP and a0.nbytes == 0
            assert e1.round == 1 and not e1.flags & NONFINITE
            (_, want), = [x for x in ref_out[w] if x[1] is not None]
            np.testing.assert_array_equal(a1, want)

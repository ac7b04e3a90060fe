"""byteps/core/local/settle.py: the local ranks of a host leave a global barrier together
(pure logic: two ranks' BarrierSettle objects wired to each other, no sockets)."""
import threading
import time

from byteps.core.local import settle
from byteps.core.local.settle import BarrierSettle


class _Wire:
    """What the local thread does: flush() sends to the peers, got() takes a message."""

    def __init__(self):
        self.sent = []

    def send(self, msg, flags=0):
        self.sent.append(msg)


def test_a_rank_leaves_only_after_the_other_passed():
    a, b = BarrierSettle(2, 0), BarrierSettle(2, 1)
    wire = _Wire()
    out = {}

    def rank1():
        b.passed(lambda: b.flush({0: wire}))
        out["t1"] = time.monotonic()
    t = threading.Thread(target=rank1)
    t.start()
    time.sleep(0.2)                      # rank 0 is still in the scheduler's barrier
    assert t.is_alive() and "t1" not in out
    t0 = time.monotonic()
    a.passed(lambda: (a.flush({1: wire}), b.got(wire.sent[-1])))
    t.join(2)
    assert out["t1"] >= t0               # rank 1 left after rank 0 passed
    assert len(wire.sent) == 2 and all(len(m) == 17 for m in wire.sent)
    # rank 0 heard rank 1's word (sent first): its next barrier waits for the next one
    assert a.got(wire.sent[0]) and a.seen[1] == (0, 1)


def test_the_wait_is_bounded_and_other_messages_are_not_taken(monkeypatch):
    monkeypatch.setattr(settle, "BOUND_S", 0.2)
    s = BarrierSettle(3, 1)
    t0 = time.monotonic()
    s.passed(lambda: None)                # nobody answers: the barrier is complete anyway
    assert 0.15 < time.monotonic() - t0 < 2
    assert not s.got(b"\x00" * 8)         # a tensor key: the reducer's own message
    assert not s.got(b"B" * 13)
    assert s.got(settle._MSG.pack(b"B", 7, 0, 5)) and 7 not in s.seen   # not a local rank
    assert BarrierSettle(1, 0).passed(lambda: 1 / 0) is None         # one local rank: no-op


def test_a_joined_rank_is_not_waited_for_and_counts_restart_after_join():
    a = BarrierSettle(2, 0)
    flags = [0, 1]                        # local rank 1 is inside its first join()
    t0 = time.monotonic()
    a.passed(lambda: None, 0, flags)      # barrier 1 while rank 1 is joined: no wait
    a.passed(lambda: None, 0, flags)
    assert time.monotonic() - t0 < 0.5
    flags[0] = 1                          # after join(): generation 1, counts from 1 again
    assert a.got(settle._MSG.pack(b"B", 1, 1, 1))   # rank 1 passed its barrier first
    t0 = time.monotonic()
    a.passed(lambda: None, 1, flags)
    assert time.monotonic() - t0 < 0.5 and a.k == 1 and a.out[-1] == (1, 1)

"""The worker engine without sockets: priority order, credits, fusion, resends and results.

The engine gets stand-in server connections (``Engine(..., servers=..., start=False)``) and
the test drives its steps (take_pending, dispatch, on_server, resend_overdue) itself
(``eng.links``: its server connections, byteps/core/engine/servers.py); every
message goes through the real wire format (encode/decode, MAC, validation).
"""
from __future__ import annotations

import collections
import dataclasses
import types

import numpy as np

from byteps.common.config import Config
from byteps.core.engine import MAX_FUSED_ENTRIES, Engine, Handle, Task
from byteps.transport import wire
from byteps.transport.wire import ACK, PULL, PUSH, Entry, Op

SECRET = b"engine-unit-test-secret"
JOB = "unit"
EPOCH = 3


class Conn:
    """A server connection: records what the engine sends, hands it what the test queues."""

    def __init__(self, node_id: int):
        self.node_id, self.sent, self.inbox, self.seq = node_id, [], collections.deque(), 0

    def send_multipart(self, frames, copy=False):
        self.sent.append(list(frames))

    def recv_multipart(self, copy=False):
        return self.inbox.popleft()

    def poll(self, timeout=0):
        return bool(self.inbox)

    def close(self, linger=0):
        pass

    def messages(self) -> list[tuple[list, list, list]]:
        """(entries, decls, payload) of every DATA message sent so far; clears the record."""
        out = []
        for frames in self.sent:
            hdr, payload = wire.decode(frames, JOB, SECRET)
            assert hdr.op == Op.DATA and hdr.epoch == EPOCH
            out.append(([Entry._make(e) for e in hdr.body[0]], hdr.body[1], payload))
        self.sent.clear()
        return out

    def answer(self, entries: list, payload=()) -> None:
        """Queue a RESULT from this server."""
        self.seq += 1
        self.inbox.append(wire.encode(JOB, self.node_id, Op.RESULT, EPOCH, self.seq,
                                      [[list(e) for e in entries], []], SECRET) + list(payload))


def make(nservers=2, size=2, **cfg):
    cfg = dict(dict(job_id=JOB, enable_ipc=False, partition_bytes=1000, scheduling_credit=4,
                    fusion_bytes=4096, resend_timeout_s=0.5), **cfg)
    conns = [Conn(10 + i) for i in range(nservers)]
    book = {"rank": 0, "size": size,
            "servers": [{"address": f"tcp://10.0.0.{i}:9", "node_id": 10 + i, "machine": "m"}
                        for i in range(nservers)]}
    link = types.SimpleNamespace(secret=SECRET, node_id=1, epoch=EPOCH, sock=None,
                                 tick=lambda now: None)
    eng = Engine(Config(**cfg), None, link, book, servers=conns, start=False)
    return eng, conns


_ids = iter(range(1, 1 << 30))


def push(eng, n: int, server: int = 0, priority: int = 0, dtype=np.float32, name=None,
         value: float = 1.0) -> tuple[Handle, list[Task]]:
    """One single-partition push_pull of ``n`` elements, as byteps.core.api submits it."""
    hid = next(_ids)
    src = np.full(n, value, dtype)
    tensor = types.SimpleNamespace(key=1000 + hid, name=name or f"t{hid}", shape=(n,),
                                   dtype_code=wire.DTYPE_CODE[np.dtype(dtype)], busy=hid)
    h = Handle(hid, tensor, np.zeros_like(src), 1, True)
    t = Task(h, part=0, start=0, length=n, server=server, round=0, src=src, prio=-priority,
             seq=hid)
    eng.submit([t])
    return h, [t]


def step(eng):
    eng.take_pending()
    eng.dispatch()


def names(messages) -> list[str]:
    return [e.key for entries, _, _ in messages for e in entries]


def test_priority_order_and_fusion_per_server():
    eng, (s0, s1) = make(fusion_bytes=4096)
    low = [push(eng, 25, server=0, priority=0)[0] for _ in range(3)]
    high = [push(eng, 25, server=0, priority=5)[0] for _ in range(2)]
    other = [push(eng, 25, server=1, priority=1)[0] for _ in range(2)]
    step(eng)
    m0, m1 = s0.messages(), s1.messages()
    assert len(m0) == 1 and len(m1) == 1            # small partitions: one message per server
    assert names(m0) == [h.tensor.key for h in high + low]     # higher priority first
    assert names(m1) == [h.tensor.key for h in other]
    entries, decls, payload = m0[0]
    # averaged float pushes ask the server to divide (wire.AVG)
    assert all(e.flags == PUSH | PULL | wire.AVG and e.length == 25 for e in entries)
    assert [d[1] for d in decls] == [h.tensor.name for h in high + low]   # declared once
    assert [p.nbytes for p in payload] == [100] * 5
    # a partition above BYTEPS_FUSION_BYTES travels alone; the fused ones stay capped
    push(eng, 2000, server=0)
    for _ in range(MAX_FUSED_ENTRIES + 5):
        push(eng, 1, server=1)
    eng.cfg = dataclasses.replace(eng.cfg, scheduling_credit=1 << 20)    # no credit limit
    step(eng)
    assert [len(e) for e, _, _ in s0.messages()] == [1]
    assert [len(e) for e, _, _ in s1.messages()] == [MAX_FUSED_ENTRIES, 5]
    # a server gets its partitions in heap order: small ones queued for fusion leave before
    # a bigger one behind them (a tensor's finer edge partitions first), not after it
    small = [push(eng, 25, server=0, priority=9)[0] for _ in range(2)]
    big = push(eng, 2000, server=0, priority=1)[0]
    step(eng)
    assert names(s0.messages()) == [h.tensor.key for h in small + [big]]


def test_credit_window_and_overtaking():
    eng, (s0, _) = make(partition_bytes=1000, scheduling_credit=1, fusion_bytes=0)
    assert eng.cfg.credit_bytes == 1000
    a = push(eng, 200, priority=0)[0]      # 800 bytes each
    b = push(eng, 200, priority=0)[0]
    step(eng)
    assert names(s0.messages()) == [a.tensor.key]           # b waits: 800 + 800 > 1000
    assert eng.inflight_bytes == 800
    c = push(eng, 200, priority=9)[0]      # later, but more urgent
    step(eng)
    assert s0.messages() == []
    s0.answer([Entry(a.tensor.key, 0, 0, ACK, 0, 200)])     # the server's receipt
    eng.on_server(s0)
    assert eng.inflight_bytes == 0
    step(eng)
    assert names(s0.messages()) == [c.tensor.key]           # c overtakes the queued b
    s0.answer([Entry(c.tensor.key, 0, 0, ACK, 0, 200)])
    eng.on_server(s0)
    step(eng)
    assert names(s0.messages()) == [b.tensor.key]


def test_result_completes_averages_and_releases_credit():
    eng, (s0, _) = make(size=2, fusion_bytes=0)
    h, (t,) = push(eng, 4, value=3.0)
    hi, (ti,) = push(eng, 3, dtype=np.int32, value=3)
    step(eng)
    assert len(s0.messages()) == 2
    s0.answer([Entry(h.tensor.key, 0, 0, 0, 0, 4), Entry(hi.tensor.key, 0, 0, 0, 3, 3)],
              [np.full(4, 6.0, np.float32), np.full(3, 7, np.int32)])
    eng.on_server(s0)           # no ACK first: the result itself returns the credit
    assert h.event.is_set() and hi.event.is_set() and h.error is None
    np.testing.assert_array_equal(h.out, np.full(4, 3.0, np.float32))     # sum / size
    np.testing.assert_array_equal(hi.out, np.full(3, 3, np.int32))        # floor division
    assert hi.out.dtype == np.int32
    assert eng.inflight == {} and eng.inflight_bytes == 0
    # a result the server already averaged (AVG) is copied, not divided again
    ha, _ = push(eng, 4, value=3.0)
    step(eng)
    s0.messages()
    s0.answer([Entry(ha.tensor.key, 0, 0, wire.AVG, 0, 4)], [np.full(4, 3.0, np.float32)])
    eng.on_server(s0)
    np.testing.assert_array_equal(ha.out, np.full(4, 3.0, np.float32))
    # a duplicate or stale result is ignored; a wrong-size payload is dropped
    s0.answer([Entry(h.tensor.key, 0, 0, 0, 0, 4)], [np.full(4, 99.0, np.float32)])
    eng.on_server(s0)
    np.testing.assert_array_equal(h.out, np.full(4, 3.0, np.float32))
    h2, _ = push(eng, 4)
    step(eng)
    s0.messages()
    s0.answer([Entry(h2.tensor.key, 0, 0, 0, 0, 4)], [np.zeros(3, np.float32)])
    eng.on_server(s0)
    assert not h2.event.is_set() and (h2.tensor.key, 0) in eng.inflight


def test_resend_push_until_acked_then_pull_only():
    eng, (s0, _) = make(resend_timeout_s=0.5, fusion_bytes=0)
    h, (t,) = push(eng, 8)
    step(eng)
    assert len(s0.messages()) == 1
    sent = t.sent_at
    eng.resend_overdue(sent + 0.1)               # not overdue yet
    assert s0.messages() == []
    eng.links.heard[0] = sent - 10                     # the server has been silent
    eng.resend_overdue(sent + 0.6)
    (entries, _, payload), = s0.messages()       # unacknowledged: the push again, in full
    assert entries == [Entry(h.tensor.key, 0, 0, PUSH | PULL | wire.AVG, 0, 8)] and \
        len(payload) == 1
    assert eng.resends == 1 and t.tries == 1
    eng.resend_overdue(t.sent_at + 0.6)          # the wait doubles per try
    assert s0.messages() == []
    s0.answer([Entry(h.tensor.key, 0, 0, ACK, 0, 8)])
    eng.on_server(s0)
    assert t.acked and eng.inflight_bytes == 0
    eng.resend_overdue(t.sent_at + 5)            # acknowledged: only ask for the result
    (entries, decls, payload), = s0.messages()
    assert entries == [Entry(h.tensor.key, 0, 0, PULL, 0, 8)] and payload == [] and decls == []
    s0.answer([Entry(h.tensor.key, 0, 0, 0, 0, 8)], [np.full(8, 4.0, np.float32)])
    eng.on_server(s0)
    assert h.event.is_set()
    np.testing.assert_array_equal(h.out, np.full(8, 2.0, np.float32))


def test_forged_and_replayed_results_are_dropped():
    eng, (s0, s1) = make(fusion_bytes=0)
    h, _ = push(eng, 4)
    step(eng)
    s0.messages()
    s1.node_id = 99                  # a message whose sender is not this server's node
    s1.answer([Entry(h.tensor.key, 0, 0, 0, 0, 4)], [np.ones(4, np.float32)])
    s0.inbox.append(s1.inbox.popleft())
    eng.on_server(s0)
    assert not h.event.is_set()
    s0.answer([Entry(h.tensor.key, 0, 0, ACK, 0, 4)])
    replay = list(s0.inbox[0])
    eng.on_server(s0)
    s0.inbox.append(replay)          # the same seq again
    before = eng.inflight_bytes
    eng.on_server(s0)
    assert eng.inflight_bytes == before


def test_completion_callbacks_and_a_servers_data_error():
    eng, (s0, _) = make(fusion_bytes=0)
    seen = []
    h, (t,) = push(eng, 4)
    h.on_done = seen.append
    bad, _ = push(eng, 4)
    bad.on_done = seen.append
    step(eng)
    s0.messages()
    s0.answer([Entry(h.tensor.key, 0, 0, 0, 0, 4)], [np.ones(4, np.float32)])
    eng.on_server(s0)
    assert seen == [h] and h.event.is_set() and h.error is None and h.tensor.busy is None
    s0.seq += 1              # the server refuses the other tensor (e.g. a shape mismatch)
    s0.inbox.append(wire.encode(JOB, s0.node_id, Op.DATA_ERROR, EPOCH, s0.seq,
                                {"key": bad.tensor.key, "message": "tensor 'x': mismatch"},
                                SECRET))
    eng.on_server(s0)
    assert seen == [h, bad] and bad.event.is_set() and "mismatch" in str(bad.error)
    assert eng.inflight == {} and eng.inflight_bytes == 0


def test_shared_memory_partitions_take_no_credit(tmp_path, monkeypatch):
    monkeypatch.setenv("BYTEPS_SHM_DIR", str(tmp_path))
    eng, (s0, s1) = make(partition_bytes=1000, scheduling_credit=1, fusion_bytes=0)
    eng.links.shm_ok = [True, False]             # server 0 is colocated, server 1 over TCP
    hs = [push(eng, 200, server=0)[0] for _ in range(3)]      # 800 bytes each
    step(eng)
    m0 = s0.messages()
    assert names(m0) == [h.tensor.key for h in hs] and eng.inflight_bytes == 0
    assert all(e.flags & wire.SHM and p == [] for entries, _, p in m0 for e in entries)
    a, b = push(eng, 200, server=1)[0], push(eng, 200, server=1)[0]
    step(eng)
    assert names(s1.messages()) == [a.tensor.key] and eng.inflight_bytes == 800
    c = push(eng, 200, server=0, priority=9)[0]     # the window is full, c needs none
    step(eng)
    assert names(s0.messages()) == [c.tensor.key] and s1.messages() == []
    s1.answer([Entry(a.tensor.key, 0, 0, ACK, 0, 200)])
    eng.on_server(s1)
    assert eng.inflight_bytes == 0
    step(eng)
    assert names(s1.messages()) == [b.tensor.key] and eng.inflight_bytes == 800
    for seg in eng.links.push_segs.values():
        seg.close()


def test_shared_memory_pushes_leave_the_division_to_the_worker(tmp_path, monkeypatch):
    """An averaging push through shared memory asks the server for no division (no AVG):
    its worker copies the result out of the segment anyway and divides as it copies; a
    push over a socket still carries AVG."""
    from byteps.transport import shm
    monkeypatch.setenv("BYTEPS_SHM_DIR", str(tmp_path))
    eng, (s0, s1) = make(size=2, fusion_bytes=0)
    eng.links.shm_ok = [True, False]             # server 0 is colocated, server 1 over TCP
    h, _ = push(eng, 4, server=0, value=3.0)
    tcp, _ = push(eng, 4, server=1, value=3.0)
    step(eng)
    (entries, _, payload), = s0.messages()
    assert entries == [Entry(h.tensor.key, 0, 0, PUSH | PULL | wire.SHM, 0, 4)] and not payload
    (entries, _, _), = s1.messages()
    assert entries == [Entry(tcp.tensor.key, 0, 0, PUSH | PULL | wire.AVG, 0, 4)]
    # the server summed into its result segment and answers with a header, without AVG
    res = shm.Segment(shm.result_path(JOB, 10, h.tensor.key, 0, 0), 16, True)
    res.array(np.float32, 4)[:] = 6.0
    s0.answer([Entry(h.tensor.key, 0, 0, PULL | wire.SHM, 0, 4)])
    eng.on_server(s0)
    assert h.event.is_set() and h.error is None
    np.testing.assert_array_equal(h.out, np.full(4, 3.0, np.float32))     # sum / size
    for seg in list(eng.links.push_segs.values()) + [res]:
        seg.close()


def test_colocated_job_gets_larger_partitions(monkeypatch):
    from byteps.core.engine.servers import COLOCATED_PARTITION_BYTES, colocated_config
    from byteps.transport.shm import machine_id
    me = machine_id()
    book = {"servers": [{"machine": me}] * 2, "workers": [{"machine": me}] * 2}
    cfg = Config.from_env({})
    assert colocated_config(cfg, book).partition_bytes == COLOCATED_PARTITION_BYTES
    # a node elsewhere, shared memory off, or an explicit size: unchanged
    other = dict(book, workers=[{"machine": me}, {"machine": "elsewhere/1/2"}])
    assert colocated_config(cfg, other) is cfg
    assert colocated_config(Config.from_env({"BYTEPS_ENABLE_IPC": "0"}), book).partition_bytes \
        == 4096000
    explicit = Config.from_env({"BYTEPS_PARTITION_BYTES": "4096000"})
    assert colocated_config(explicit, book) is explicit

"""Issue 6, tests 6, 7 and 10: message loss, malformed/oversize frames, duplicate names."""
import os
import socket
import sys
import time

import msgpack
import pytest
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from fail_cluster import Cluster  # noqa: E402

from byteps.transport.wire import PROTOCOL_VERSION, Op, mac  # noqa: E402
from conftest import assert_ok, read_results, run_script  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("ipc", ["0", "1"])
def test_five_percent_drops_give_identical_results(tmp_path, ipc):
    common = dict(workers=2, servers=2, timeout=120, BYTEPS_PARTITION_BYTES=4096,
                  BYTEPS_FUSION_BYTES=0, BYTEPS_ENABLE_IPC=ipc)
    clean_dir, drop_dir = tmp_path / "clean", tmp_path / "drop"
    clean_dir.mkdir()
    drop_dir.mkdir()
    assert_ok(run_script("fail_train.py", clean_dir, 12, **common))
    res = run_script("fail_train.py", drop_dir, 12, BYTEPS_TEST_DROP_RATE=0.05,
                     BYTEPS_RESEND_TIMEOUT_S=0.2, **common)
    assert_ok(res)
    clean, drop = read_results(clean_dir), read_results(drop_dir)
    for r in (0, 1):
        assert clean[r]["failures"] == [] and drop[r]["failures"] == [], (clean, drop)
        assert drop[r]["digest"] == clean[r]["digest"]
    assert clean[0]["dropped"] == 0 and clean[0]["resends"] == 0
    print(f"ipc={ipc}: results dropped {[drop[r]['dropped'] for r in (0, 1)]}, partitions "
          f"resent {[drop[r]['resends'] for r in (0, 1)]}")
    # the knob really dropped results at the workers, and lost work was resent
    assert sum(drop[r]["dropped"] for r in (0, 1)) > 0, drop
    assert sum(drop[r]["resends"] for r in (0, 1)) > 0, drop


def _frames(job: str, secret: bytes, op: int, body, sender: int = 1, version=PROTOCOL_VERSION):
    hdr = msgpack.packb([version, job, sender, op, 1, time.time_ns(), body])
    return [hdr, mac(secret, hdr)]


def test_malformed_and_oversize_frames_are_dropped_memory_bounded(tmp_path):
    limit = 8 << 20
    stop = tmp_path / "stop"
    c = Cluster(tmp_path, workers=2, servers=1, args=(100000,), FAIL_STEP_SLEEP=0.05,
                BYTEPS_MAX_MSG_BYTES=limit, BYTEPS_PARTITION_BYTES=65536, FAIL_UNTIL_FILE=stop)
    try:
        c.start()
        c.wait_files("ready.rank*", 2)
        server = c.procs["server0"].pid
        before = c.rss_mb(server)
        secret = c.secret.encode()
        ctx = zmq.Context()
        addr = f"tcp://127.0.0.1:{c.server_ports[0]}"
        entry = [[[5, 0, 0, 3, 0, 1 << 20]], [[5, "x", [1 << 20], 0, 0, []]]]
        big = os.urandom(1 << 20)
        for round_ in range(3):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 2000)
            s.connect(addr)
            for _ in range(100):
                s.send(big)                                                   # single frame
                s.send_multipart([b"\xc1" + big[:4096], b"x" * 16])           # garbage header
                junk = b"\xc1" + big[:100]                    # garbage header, valid MAC
                s.send_multipart([junk, mac(secret, junk), big])
                s.send_multipart(_frames(c.job, secret, Op.DATA, entry, 3) + [b"short"])
                s.send_multipart(_frames(c.job, secret, Op.DATA, entry, 3, version=9) + [big])
                s.send_multipart(_frames(c.job, b"wrong", Op.DATA, entry, 3) + [big])
            s.close()
            for _ in range(4):                                                # oversize
                o = ctx.socket(zmq.DEALER)
                o.setsockopt(zmq.LINGER, 2000)
                o.connect(addr)
                o.send_multipart(_frames(c.job, secret, Op.DATA, entry, 3) + [b"\0" * (limit * 3)])
                o.close()
            # malformed frames to the scheduler too
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(f"tcp://127.0.0.1:{c.port}")
            for _ in range(50):
                s.send(b"garbage")
                s.send_multipart(_frames(c.job, secret, Op.HEARTBEAT, {}, 1, version=9))
                s.send_multipart(_frames(c.job, secret, Op.HEARTBEAT, [1, 2], 1))
            s.close()
        time.sleep(1.0)
        after = c.rss_mb(server)
        stop.touch()
        rcs = c.wait(120)
        ctx.term()
        assert all(rc == 0 for rc in rcs.values()), f"{rcs}\n{c.logs()}"
        out = read_results(c.dir)
        assert out[0]["failures"] == [] and out[1]["failures"] == []
        assert out[0]["digest"] == out[1]["digest"]
        print(f"server RSS {before:.1f} -> {after:.1f} MB under the flood")
        assert after - before < 50, f"server RSS grew {before:.0f} -> {after:.0f} MB"
        text = c.log("server0")
        for what in ("expected header + mac", "not valid msgpack", "bad or missing credential",
                     "protocol version 9", "message from unregistered peer", "BYTEPS_MAX_MSG_BYTES"):
            assert what in text, f"{what!r} not logged by the server:\n{text[-4000:]}"
        # logging is rate limited: far fewer lines than the ~1500 bad messages
        assert text.count("dropped") < 60, text.count("dropped")
        sched = c.log("scheduler")
        assert "dropped" in sched and "protocol version 9" in sched, sched[-3000:]
    finally:
        c.close()


def test_duplicate_name_in_flight_is_a_local_error(tmp_path):
    res = run_script("fail_train.py", tmp_path, 2, "dup", workers=2, servers=1, timeout=90)
    assert_ok(res)
    out = read_results(tmp_path)
    err = out[0]["dup_error"]
    assert err and "'dup.t'" in err and "already in flight on rank 0" in err, err
    assert "synchronize()" in err
    assert out[0]["failures"] == [] and out[1]["failures"] == []


def test_listen_address_follows_dmlc_node_host(tmp_path):
    """Servers listen on DMLC_NODE_HOST only; an address not on this machine is an error."""
    stop = tmp_path / "stop"
    c = Cluster(tmp_path, workers=1, servers=1, args=(100000,), DMLC_NODE_HOST="127.0.0.2",
                FAIL_STEP_SLEEP=0.05, FAIL_UNTIL_FILE=stop)
    try:
        c.start()
        c.wait_files("ready.rank*", 1)
        assert c.listening().get(c.server_ports[0]) == "127.0.0.2", c.listening()
        with socket.socket() as probe:     # nothing answers on another loopback address
            assert probe.connect_ex(("127.0.0.3", c.server_ports[0])) != 0
        stop.touch()
        rcs = c.wait(60)
        assert all(rc == 0 for rc in rcs.values()), f"{rcs}\n{c.logs()}"
    finally:
        c.close()


def test_store_dedups_resent_pushes_and_answers_pull_only_requests():
    """Unit check of the server store under resends (sync and async)."""
    import numpy as np

    from byteps.server.store import Slot, apply
    from byteps.transport.wire import PULL, PUSH, Entry

    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    slot = Slot(7, 0, 0, 4, -1)
    e = Entry(7, 0, 0, PUSH | PULL, 0, 4)
    pull = Entry(7, 0, 0, PULL, 0, 4)
    out: dict = {}
    apply(slot, e, a, 0, b"w0", 2, out)
    apply(slot, e, a.copy(), 0, b"w0", 2, out)      # resent push: not summed twice
    apply(slot, pull, None, 0, b"w0", 2, out)       # pull-only while waiting: no dup
    assert out == {}
    apply(slot, e, b, 1, b"w1", 2, out)
    assert [len(out[w]) for w in (b"w0", b"w1")] == [1, 1]
    np.testing.assert_array_equal(out[b"w0"][0][1], a + b)
    out.clear()
    apply(slot, pull, None, 0, b"w0", 2, out)       # pull-only after the round: resent
    np.testing.assert_array_equal(out[b"w0"][0][1], a + b)
    out.clear()
    apply(slot, e, a, 1, b"w1", 2, out)                    # late duplicate push of rank 1
    np.testing.assert_array_equal(out[b"w1"][0][1], a + b)
    # async (asynchronous keys, unbounded staleness): a resent push is applied once
    from byteps.server.staleness import AsyncStore
    astore, aslot = AsyncStore(None), Slot(8, 0, 0, 4, -1)
    out.clear()
    for rnd, arr in ((0, a), (0, a), (1, b)):
        astore.apply(aslot, Entry(8, 0, rnd, PUSH | PULL, 0, 4), arr, 0, b"w0", {0}, out)
    np.testing.assert_array_equal(aslot.value, a + b)
    aslot.reset_rounds()                     # re-init: rounds restart at 0
    astore.apply(aslot, Entry(8, 0, 0, PUSH, 0, 4), a, 0, b"w0", {0}, out)
    np.testing.assert_array_equal(aslot.value, a + b + a)

"""Issue 17: decentralized SGD (peer to peer), its low-precision variant, convergence of
every algorithm on the digits MLP, and a peer killed with SIGKILL.  Real multi-process
jobs, each with a timeout (docs/algorithms.md)."""
import os
import signal
import sys
import time

import numpy as np
import pytest

from conftest import assert_ok, read_results, run_script

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from fail_cluster import Cluster  # noqa: E402

NOIPC = {"BYTEPS_ENABLE_IPC": 0}
K = 7                 # steps: shift_one distances 1, 2, 3, 1, 2, 3, 1 on 4 ranks


def _ref_params(rank):
    rng = np.random.default_rng(100 + rank)
    return {"w": rng.standard_normal((5, 3)).astype(np.float32),
            "b": rng.standard_normal(7).astype(np.float32)}


def _ref_grad(rank, step, name, shape):
    rng = np.random.default_rng([rank, step, len(name)])
    return rng.standard_normal(shape).astype(np.float32)


def _flat(p):
    return np.concatenate([p[k].reshape(-1) for k in sorted(p)])


def reference(algo: str, n: int, k: int) -> list[np.ndarray]:
    """The update rule of docs/algorithms.md in one process, float32 (flat, sorted names)."""
    from byteps.compression import parse
    from byteps.compression.int8 import Int8
    xs = [_flat(_ref_params(r)) for r in range(n)]
    shapes = {"b": (7,), "w": (5, 3)}
    if algo == "lowp":
        mean = xs[0].copy()
        for x in xs[1:]:
            mean += x
        xs = [mean / n for _ in range(n)]
        hat = [x.copy() for x in xs]            # the replica every holder keeps of rank r
        codec = Int8(parse({"compressor": "int8", "bucket": 1024}), xs[0].size, 0, 0)
    for t in range(k):
        for r in range(n):
            g = np.concatenate([_ref_grad(r, t, name, shapes[name]).reshape(-1)
                                for name in sorted(shapes)])
            xs[r] = xs[r] - np.float32(0.1) * g
        if algo == "shift_one":
            d = 1 + t % (n - 1)
            new = []
            for r in range(n):
                p = (r - d) % n
                new.append(((xs[r] + xs[p]) if r < p else (xs[p] + xs[r])) / 2)
            xs = new
        elif algo == "all":
            acc = xs[0].copy()
            for x in xs[1:]:
                acc += x
            xs = [acc / n for _ in range(n)]
        else:
            dec = np.empty_like(xs[0])
            for r in range(n):
                codec.decompress(codec.compress(xs[r] - hat[r], t), t, dec)
                hat[r] = hat[r] + dec
            new = []
            for r in range(n):
                nb = sorted({(r - 1) % n, (r + 1) % n} - {r})
                mix = np.zeros_like(xs[r])
                for j in nb:
                    mix += hat[j]
                    mix -= hat[r]
                new.append(xs[r] + (1.0 / (len(nb) + 1)) * mix)
            xs = new
    return xs


@pytest.mark.timeout(90)
def test_decentralized_equals_numpy_reference(tmp_path):
    """4 ranks, K steps of shift_one, all and low precision against one process."""
    assert_ok(run_script("algo_decentral.py", tmp_path, "ref", K, workers=4, servers=1,
                         timeout=80, **NOIPC))
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2, 3]
    for algo in ("shift_one", "all", "lowp"):
        ref = reference(algo, 4, K)
        for r in range(4):
            got = _flat({k: np.array(v, np.float32) for k, v in out[r][algo].items()})
            tol = 1e-6 if algo != "lowp" else 1e-5
            np.testing.assert_allclose(got, ref[r], rtol=tol, atol=tol,
                                       err_msg=f"{algo} rank {r}")
            if algo == "shift_one":       # two-term sums: exact, not just close
                assert np.array_equal(got, ref[r]), (algo, r)
        assert not np.allclose(ref[0], ref[1]) or algo == "all"   # the test can fail
        finals = [_flat({k: np.array(v, np.float32) for k, v in out[r][algo + ".final"]
                         .items()}) for r in range(4)]
        assert all(np.array_equal(finals[0], f) for f in finals[1:]), algo


ALGOS = "sync,async,average,shift_one,all,lowp"


@pytest.mark.timeout(150)
def test_every_algorithm_converges_on_digits(tmp_path):
    """One job, 4 workers: each algorithm trains the MLP to within 2 points of sync."""
    assert_ok(run_script("algo_decentral.py", tmp_path, "train", ALGOS, workers=4, servers=1,
                         timeout=140, BYTEPS_ASYNC_STALENESS=2, **NOIPC))
    out = read_results(tmp_path)
    base = out[0]["sync"]["acc"]
    assert base > 0.8, out[0]
    for algo in ALGOS.split(","):
        accs = [out[r][algo]["acc"] for r in range(4)]
        assert min(accs) >= base - 0.02, (algo, accs, base)
        assert len({out[r][algo]["digest"] for r in range(4)}) == 1, algo   # identical


@pytest.mark.timeout(90)
def test_killed_peer_is_named_within_10_s(tmp_path):
    c = Cluster(tmp_path, workers=4, servers=1, args=("kill",), script="algo_decentral.py")
    try:
        c.start()
        c.wait_files("ready.rank*", 4)
        victim = c.worker_pid(2)
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        others = [f"worker{w}" for w in (0, 1, 3)]
        c.wait(30, others)
        late = {w: c.exit_at.get(w, 1e9) - t_kill for w in others
                if c.exit_at.get(w, 1e9) - t_kill > 10}
        assert not late, f"not ended within 10 s: {late}\n{c.logs()}"
        assert all(c.procs[w].returncode != 0 for w in others), c.logs()
        out = read_results(tmp_path)
        assert sorted(out) == [0, 1, 3], c.logs()
        for r in (0, 1, 3):
            err = out[r]["error"]
            assert "worker rank 2" in err and f"pid {victim}" in err, err
    finally:
        c.close()


@pytest.mark.timeout(180)
def test_tensorflow_and_keras_train_digits_async(tmp_path):
    """BYTEPS_ENABLE_ASYNC=1: Keras model.fit and a TF tf.function loop run AsyncPS (local
    step, push the change, pull the servers' parameters); no divergence, identical ends."""
    pytest.importorskip("tensorflow")
    assert_ok(run_script("tf_async.py", tmp_path, workers=2, servers=1, timeout=170,
                         BYTEPS_ENABLE_ASYNC=1, **NOIPC))
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    # init before the first update, after_step after each update, its result kept
    assert out[0]["order"] == [999.0, 1098.0, 1197.0, 1297.0], out[0]["order"]
    for kind in ("keras", "tf"):
        assert out[0]["async"] == "AsyncPS"
        assert out[0][kind]["acc"] > 0.8, out[0]
        assert out[0][kind]["digest"] == out[1][kind]["digest"], kind


@pytest.mark.timeout(120)
def test_torch_decentralized_trains_digits(tmp_path):
    """byteps.torch DistributedOptimizer(algorithm=Decentralized / LowPrecisionDecentralized)
    on 3 workers (odd: shift_one's distances 1, 2; the ring's two neighbours)."""
    pytest.importorskip("torch")
    assert_ok(run_script("torch_decentral.py", tmp_path, workers=3, servers=1, timeout=110,
                         **NOIPC))
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2]
    for name in ("shift_one", "lowp"):
        assert out[0][name]["acc"] > 0.8, out[0]
        assert len({out[r][name]["digest"] for r in range(3)}) == 1, name   # finish()


def test_peer_messages_are_authenticated_and_validated():
    """PeerNet without a job: forged, replayed, malformed and foreign frames are dropped;
    a valid one arrives; a layout mismatch is an error naming the peer."""
    import types

    import zmq

    from byteps.core.algorithms import peers
    from byteps.core.node import BytePSError
    from byteps.transport.wire import Op, WireError, encode

    cfg = types.SimpleNamespace(enable_peers=True, node_host="127.0.0.1", peer_port=0,
                                max_msg_bytes=1 << 20, job_id="j", stall_warning_s=60,
                                heartbeat_timeout=10, heartbeat_interval=1,
                                tcp_congestion=None)
    ctx = zmq.Context()
    sock, addr = peers.listen(cfg, ctx)
    net = peers.PeerNet(cfg, ctx, sock, addr, b"secret")
    book = {"rank": 0, "workers": [{"rank": 0, "node_id": 5, "address": addr},
                                   {"rank": 1, "node_id": 6, "address": "tcp://127.0.0.1:1"}]}
    net.attach(book, 5, 3, lambda: None)
    d = ctx.socket(zmq.DEALER)
    d.connect(addr)
    payload = np.arange(4, dtype=np.float32)
    body = {"tag": 0, "slot": 0, "kind": 0, "nbytes": 16, "layout": 7}

    def send(sender=6, epoch=3, seq=10, b=body, secret=b"secret", data=payload.tobytes()):
        d.send_multipart(encode("j", sender, Op.PEER, epoch, seq, b, secret) + [data])
    try:
        send(secret=b"wrong", b=dict(body, tag=1))            # forged MAC
        send(sender=9, b=dict(body, tag=2))                   # not a worker of the book
        send(sender=5, b=dict(body, tag=3))                   # claims to be this rank
        send(epoch=2, b=dict(body, tag=4))                    # stale epoch
        send(b=dict(body, tag=5, nbytes=8))                   # payload size != header
        send(b=dict(body, tag=6, extra=1))                    # unknown field
        send(b=dict(body, tag=-1))                            # out of range
        send(seq=11)                                          # valid: tag 0
        send(seq=11, b=dict(body, tag=7))                     # replayed seq
        got = net.recv(1, 0, 0, 0, 7, 16, "test")
        assert np.frombuffer(got, np.float32).tolist() == payload.tolist()
        time.sleep(0.2)
        net._read()
        assert net.inbox == {}, net.inbox                     # every bad one dropped
        send(seq=12, b=dict(body, tag=8, layout=9))
        with pytest.raises(BytePSError, match="rank 1.*layout"):
            net.recv(1, 8, 0, 0, 7, 16, "test")
        for bad in ({}, dict(body, kind=16), dict(body, tag="0"), dict(body, nbytes=True)):
            with pytest.raises(WireError):
                peers.check_body(bad)
    finally:
        d.close(0)
        net.close()
        ctx.term()


def test_decentralized_single_process_and_argument_errors():
    """One process (no peers): the decentralized algorithms are no-ops; bad arguments
    raise naming the choices."""
    import byteps.numpy as bps
    with pytest.raises(ValueError, match="shift_one"):
        bps.algorithms.Decentralized(peer_selection="star")
    with pytest.raises(ValueError, match="communication_interval"):
        bps.algorithms.Decentralized(communication_interval=0)
    with pytest.raises(ValueError, match="gamma"):
        bps.algorithms.LowPrecisionDecentralized(gamma=0)
    bps.init()
    try:
        for alg in (bps.algorithms.Decentralized("shift_one"),
                    bps.algorithms.LowPrecisionDecentralized()):
            w = np.ones(3, np.float32)
            opt = bps.DistributedOptimizer(lambda p, g: p["w"].__isub__(g["w"]), {"w": w},
                                           algorithm=alg)
            opt.step({"w": np.full(3, 0.5, np.float32)})
            opt.finish()
            assert w.tolist() == [0.5] * 3
        with pytest.raises(TypeError, match="floating"):
            bps.algorithms.Decentralized().init({"i": np.ones(2, np.int32)})
    finally:
        bps.shutdown()

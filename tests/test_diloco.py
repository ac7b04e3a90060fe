"""DiLoCo on the parameter servers (docs/algorithms.md): the outer optimizer on the
servers, the wire's outer field, and one real 2-worker job (tests/scripts/diloco_job.py)
whose phases are checked against a one-process numpy replay of the same algorithm.

The numbers of the benchmark (bytes, time to a loss over an emulated wide-area network)
come from ``benchmarks/wide_area.py``, which is not a test.
"""
import json
import sys

import msgpack
import numpy as np
import pytest
from conftest import SCRIPTS, assert_ok, read_results, run_job, run_script

LR = np.float32(0.05)


# ------------------------------------------------------------------ the replay
def _ls_data(rank):
    rng = np.random.default_rng(100 + rank)
    X = rng.standard_normal((32, 6)).astype(np.float32)
    y = (X @ np.arange(1, 7, dtype=np.float32) + rank).astype(np.float32)
    return X, y


def _ls_grad(p, rank):
    X, y = _ls_data(rank)
    return {"w": (X.T @ (X @ p["w"] - y) / np.float32(32)).astype(np.float32),
            "b": np.array([np.mean(X @ p["w"] - y)], np.float32)}


def _outer(x, m, g, lr, mu, nesterov):
    """The outer SGD step written out again (torch.optim.SGD's order), float32."""
    f = np.float32
    m *= f(mu)
    m += g
    d = (m * f(mu) + g) if nesterov else m.copy()
    d *= f(lr)
    x -= d


def _replay(steps, H, lr, mu, nesterov=True, frags=(("w", "b"),), ranks=2):
    """DiLoCo in one process: every rank's inner SGD, the staggered rounds, the servers'
    weighted sum and outer step, the final round of finish().  Returns (params, syncs)."""
    F = len(frags)
    G = {"w": np.full(6, 0.5, np.float32), "b": np.zeros(1, np.float32)}   # rank 0's
    M = {k: np.zeros_like(v) for k, v in G.items()}
    local = [{k: v.copy() for k, v in G.items()} for _ in range(ranks)]
    ref = [{k: v.copy() for k, v in G.items()} for _ in range(ranks)]
    since = [0] * F
    syncs = []

    def round_(f, t):
        w = since[f]
        since[f] = 0
        syncs.append(["sync", f, t])
        total = float(w * ranks)
        if total <= 0:
            return
        for k in frags[f]:
            acc = np.zeros_like(G[k])
            for r in range(ranks):
                d = ref[r][k] - local[r][k]
                if w != total:
                    d *= d.dtype.type(w / total)
                acc += d
            _outer(G[k], M[k], acc, lr, mu, nesterov)
            for r in range(ranks):
                local[r][k] = G[k].copy()
                ref[r][k] = G[k].copy()

    for t in range(1, steps + 1):
        for r in range(ranks):
            g = _ls_grad(local[r], r)
            for k in local[r]:
                local[r][k] -= LR * g[k]
        since = [s + 1 for s in since]
        for f in range(F):
            off = H * (f + 1) // F
            if t >= off and (t - off) % H == 0:
                round_(f, t)
    for f in range(F):
        round_(f, steps)
    return G, syncs


# ------------------------------------------------------------------ in-process units
def test_outer_field_on_the_wire():
    from byteps.transport import wire
    assert wire.outer_field([0.7, 0.9, True]) == (0.7, 0.9, True)
    for bad in ([0, 0.9, True], [0.7, 1.0, True], [0.7, 0.9, 1], [float("nan"), 0, True],
                [0.7, 0.9], "x", [0.7, -0.1, False], [1e9, 0, False]):
        with pytest.raises(wire.WireError):
            wire.outer_field(bad)
    key = 5
    ok = [key, "DiLoCo.w", [4], 0, 0, [], 0, [0.7, 0.9, True]]
    old6 = [key, "g", [4], 0, 0, []]
    old7 = [key, "g", [4], 0, 0, [], 2]
    for decls in ([ok], [old6], [old7]):
        frames = wire.encode("job", 1, wire.Op.DATA, 0, 1, [[], decls])
        wire.decode(frames, "job", None)              # older declarations still decode
    for bad in ([*ok[:7], [0.7, 2.0, True]], [*ok, 1], [*ok[:7], "outer"]):
        frames = wire.encode("job", 1, wire.Op.DATA, 0, 1, [[], [bad]])
        with pytest.raises(wire.WireError, match="declaration"):
            wire.decode(frames, "job", None)
    assert wire.PROTOCOL_VERSION >= 5                 # 6: the NONFINITE flag
    hdr = msgpack.packb([4, "job", 1, int(wire.Op.HELLO), 0, 1, {}])
    with pytest.raises(wire.VersionMismatch):         # the scheduler names the version
        wire.decode([hdr, b""], "job", None)


def test_server_outer_store_seed_step_join_and_reset():
    """The server's side without sockets: seed round, one outer step per complete round
    (pulls held until then), a joined rank not waited for, a reset seeds again without
    losing the parameters or the momentum."""
    from byteps.server.outer import Outer
    from byteps.server.staleness import AsyncStore
    from byteps.server.store import Slot
    from byteps.transport.wire import ASYNC, PULL, PUSH, Entry
    st = AsyncStore(None)                     # unbounded for other keys: 0 for outer ones
    slot = Slot(1, 0, 0, 2, -1)
    slot.outer = Outer(0.5, 0.9, True)
    out = {}
    e = lambda rnd: Entry(1, 0, rnd, PUSH | PULL | ASYNC, 0, 2)
    x0 = np.array([1.0, 2.0], np.float32)
    st.apply(slot, e(0), x0, 0, b"a", {0, 1}, out)
    assert not out                                    # the seed waits for rank 1
    st.apply(slot, e(0), np.zeros(2, np.float32), 1, b"b", {0, 1}, out)
    assert out[b"a"][0][1].tolist() == [1.0, 2.0] == out[b"b"][0][1].tolist()
    out.clear()
    g0, g1 = np.array([0.2, 0.4], np.float32), np.array([0.0, 0.2], np.float32)
    st.apply(slot, e(1), g0, 0, b"a", {0, 1}, out)
    assert not out                                    # held: rank 1 has not pushed round 1
    st.apply(slot, e(1), g1, 1, b"b", {0, 1}, out)
    x, m = x0.copy(), np.zeros(2, np.float32)
    _outer(x, m, g0 + g1, 0.5, 0.9, True)
    assert out[b"a"][0][1].tolist() == x.tolist() and slot.outer.steps == 1
    out.clear()
    st.apply(slot, e(2), g0, 0, b"a", {0}, out)       # rank 1 joined: not waited for
    _outer(x, m, g0, 0.5, 0.9, True)
    assert out[b"a"][0][1].tolist() == x.tolist()
    assert slot.outer.m.tolist() == m.tolist()
    out.clear()
    slot.reset_rounds()                               # every rank joined / a new epoch
    st.apply(slot, e(0), np.full(2, 9.0, np.float32), 0, b"a", {0, 1}, out)
    st.apply(slot, e(0), np.zeros(2, np.float32), 1, b"b", {0, 1}, out)
    assert out[b"b"][0][1].tolist() == x.tolist()     # the held parameters, not the seed
    assert slot.outer.m.tolist() == m.tolist() and slot.outer.steps == 2


def test_single_process_diloco_is_the_replay_of_one_rank():
    """Without servers the worker applies the same outer step itself."""
    import byteps.numpy as bps
    from byteps.core import api
    bps.init()
    try:
        p = {"w": np.full(6, 0.5, np.float32), "b": np.zeros(1, np.float32)}
        opt = bps.DistributedOptimizer(
            lambda ps, gs: [ps[k].__isub__(LR * gs[k]) for k in ps], p,
            algorithm=bps.algorithms.DiLoCo(inner_steps=3, outer_lr=0.7, prefix="one."))
        for _ in range(7):
            opt.step(_ls_grad(p, 0))
        opt.finish()
    finally:
        api.shutdown()
    want, _ = _replay(7, 3, 0.7, 0.9, ranks=1)
    for k in p:
        np.testing.assert_array_equal(p[k], want[k])


def test_bad_arguments_name_the_parameter():
    from byteps.core.algorithms import DiLoCo
    for kw, word in (({"inner_steps": 0}, "inner_steps"), ({"outer_lr": -1}, "outer_lr"),
                     ({"outer_momentum": 1.0}, "outer_momentum"),
                     ({"fragments": 0}, "fragments"), ({"inner_seconds": 0}, "inner_seconds"),
                     ({"overlap": 0}, "overlap"), ({"overlap": 1.5}, "overlap"),
                     ({"compression_params": {"compressor": "nope"}}, "nope")):
        with pytest.raises((ValueError, TypeError), match=word):
            DiLoCo(**kw)


# ------------------------------------------------------------------ one real job
@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("diloco")
    rec = out / "rec"
    assert_ok(run_script("diloco_job.py", out, "replay,frag,ovl,ovl1,h1,sync1,digits,onebit,overlap,seconds,secjoin,join",
                         workers=2, servers=1, timeout=150, launcher_args=("--hosts", "2"),
                         BYTEPS_ENABLE_IPC=0, BYTEPS_MIN_COMPRESS_BYTES=0,
                         BYTEPS_TEST_RECORD=rec))
    res = read_results(out)
    assert sorted(res) == [0, 1]
    byte_files = list(out.glob("rec.bytes.*.json"))
    return res, [json.loads(p.read_text()) for p in byte_files]


@pytest.mark.timeout(160)
def test_h_greater_than_one_equals_the_numpy_replay(job):
    res, _ = job
    want, syncs = _replay(10, 3, 0.7, 0.9)
    for r in (0, 1):
        got = res[r]["replay"]
        assert got["log"] == syncs
        for k in want:
            np.testing.assert_array_equal(np.array(got["p"][k], np.float32), want[k])


@pytest.mark.timeout(160)
def test_fragments_stagger_and_equal_their_replay(job):
    res, _ = job
    want, syncs = _replay(9, 4, 0.5, 0.8, nesterov=False, frags=(("w",), ("b",)))
    assert syncs[:4] == [["sync", 0, 2], ["sync", 1, 4], ["sync", 0, 6], ["sync", 1, 8]]
    for r in (0, 1):
        got = res[r]["frag"]
        assert got["log"] == syncs
        for k in want:
            np.testing.assert_array_equal(np.array(got["p"][k], np.float32), want[k])


def _replay_overlap(logs, steps, H, lr, mu, frags):
    """Overlapped Streaming DiLoCo in one process, driven by each rank's recorded log:
    an exchange is merged (``local += new_global - local_at_send``) at the step the rank
    recorded; finish()'s last round of every fragment (the log's last F syncs) is not
    overlapped.  Returns the global parameters."""
    F, ranks = len(frags), len(logs)
    G = {"w": np.full(6, 0.5, np.float32), "b": np.zeros(1, np.float32)}
    M = {k: np.zeros_like(v) for k, v in G.items()}
    local = [{k: v.copy() for k, v in G.items()} for _ in range(ranks)]
    ref = [{k: v.copy() for k, v in G.items()} for _ in range(ranks)]
    since = [[0] * F for _ in range(ranks)]
    pushed = {}           # (f, k) -> [(snap, weight) per rank]
    results = {}          # (f, k) -> the new global parameters of fragment f
    sent = [[0] * F for _ in range(ranks)]       # rounds pushed per rank and fragment
    merged = [[0] * F for _ in range(ranks)]
    snaps = {}

    def result(f, k):
        if (f, k) not in results:
            total = float(sum(w for _, w in pushed[(f, k)]))
            out = {}
            for n in frags[f]:
                acc = np.zeros_like(G[n])
                for r, (d, w) in enumerate(pushed[(f, k)]):
                    d = d[n].copy()
                    if w != total:
                        d *= d.dtype.type(w / total)
                    acc += d
                _outer(G[n], M[n], acc, lr, mu, True)
                out[n] = G[n].copy()
            results[(f, k)] = out
        return results[(f, k)]

    def merge(r, f, overlap=True):
        k = merged[r][f]
        merged[r][f] += 1
        got = result(f, k)
        for n in frags[f]:
            if overlap:
                local[r][n] += got[n] - snaps[(r, f, k)][n]
            else:
                local[r][n] = got[n].copy()
            ref[r][n] = got[n].copy()

    def sync(r, f):
        k = sent[r][f]
        sent[r][f] += 1
        snaps[(r, f, k)] = {n: local[r][n].copy() for n in frags[f]}
        w, since[r][f] = since[r][f], 0
        pushed.setdefault((f, k), [None] * ranks)[r] = (
            {n: ref[r][n] - local[r][n] for n in frags[f]}, w)

    events = [[list(e) for e in log] for log in logs]
    for t in range(1, steps + 1):
        for r in range(ranks):
            g = _ls_grad(local[r], r)
            for n in local[r]:
                local[r][n] -= LR * g[n]
            since[r] = [s + 1 for s in since[r]]
            while events[r] and events[r][0][2] == t and len(events[r]) > F:
                kind, f, _ = events[r].pop(0)
                merge(r, f) if kind == "merge" else sync(r, f)
    for r in range(ranks):            # finish(): the last F syncs, not overlapped
        for _, f, _ in events[r]:
            sync(r, f)
    for f in range(F):
        for r in range(ranks):
            if pushed[(f, sent[r][f] - 1)] is not None:
                merge(r, f, overlap=False)
    return G


def _equals_overlap_replay(res, phase, logs):
    """Both ranks' parameters after ``phase`` equal the replay of the merges they logged."""
    assert sum(e[0] == "merge" for e in logs[0]) >= 2
    want = _replay_overlap(logs, 13, 4, 0.7, 0.9, (("w",), ("b",)))
    for r in (0, 1):
        for k in want:
            np.testing.assert_array_equal(np.array(res[r][phase]["p"][k], np.float32),
                                          want[k])


@pytest.mark.timeout(160)
def test_overlap_equals_its_replay(job):
    """Streaming DiLoCo with overlapped exchanges: merged when they arrive (the steps each
    rank recorded), equal to the replay of those merges bit for bit."""
    res, _ = job
    logs = [res[r]["ovl"]["log"] for r in (0, 1)]
    _equals_overlap_replay(res, "ovl", logs)


@pytest.mark.timeout(160)
def test_bounded_overlap_merges_within_k_steps_and_equals_its_replay(job):
    """overlap=1 (the paper's tau): every exchange is merged at most one inner step after
    its push (waited for when it has not arrived), and the result equals the replay."""
    res, _ = job
    logs = [res[r]["ovl1"]["log"] for r in (0, 1)]
    for log in logs:
        sent = {}
        for kind, f, at in log[:-2]:           # finish()'s last syncs are not overlapped
            if kind == "sync":
                sent[f] = at
            else:
                assert at - sent.pop(f) <= 1, log
        assert not sent, log                    # every overlapped push was merged
    _equals_overlap_replay(res, "ovl1", logs)


@pytest.mark.timeout(160)
def test_h1_no_momentum_sgd_equals_syncps_and_one_process_sgd(job):
    """H = 1, outer_lr = 1, no momentum, SGD inner: DiLoCo is SyncPS.  Both the DiLoCo
    run and a SyncPS run of the same job (phase ``sync1``, the same rows and start) equal
    a one-process reference, plain SGD on the mean of the two ranks' gradients."""
    res, _ = job
    p = {"w": np.full(6, 0.5, np.float32), "b": np.zeros(1, np.float32)}   # rank 0's
    for _ in range(6):
        g0, g1 = _ls_grad(p, 0), _ls_grad(p, 1)
        p = {k: p[k] - LR * ((g0[k] + g1[k]) / np.float32(2)) for k in p}
    assert np.abs(p["w"] - 0.5).max() > 0.1                       # it moved
    for r in (0, 1):
        for k in p:
            h1 = np.array(res[r]["h1"]["p"][k], np.float32)
            sync = np.array(res[r]["sync1"]["p"][k], np.float32)
            np.testing.assert_allclose(h1, p[k], rtol=0, atol=1e-6)
            np.testing.assert_allclose(sync, p[k], rtol=0, atol=1e-6)
            np.testing.assert_allclose(h1, sync, rtol=0, atol=1e-6)


@pytest.mark.timeout(160)
def test_int8_learns_digits_and_overlap_trains_identically(job):
    res, records = job
    for phase, bar in (("digits", 0.85), ("overlap", 0.8)):   # overlap: merge timing varies
        assert res[0][phase]["digest"] == res[1][phase]["digest"], phase
        assert res[0][phase]["acc"] > bar, (phase, res[0][phase]["acc"])
    assert any(e[0] == "merge" for e in res[0]["overlap"]["log"])
    # the bytes the server received for one tensor: each rank's exact seed (float32),
    # then one int8 frame per round (counted where they arrive)
    from byteps import compression
    frame = compression.server_pipeline(compression.parse(
        {"compressor": "int8", "ef": "vanilla"}), 64 * 32, 0, 0).frame_bytes
    got = sum(r["by_tensor"].get("digits.w1", 0) for r in records)
    rounds = res[0]["digits"]["rounds"]
    assert got == 2 * (64 * 32 * 4 + rounds * frame), (got, rounds, frame)
    assert frame < 64 * 32 * 4 / 3.9                 # int8: about 4x fewer bytes


@pytest.mark.timeout(160)
def test_onebit_outer_gradients_send_the_bytes_they_should(job):
    """onebit + error feedback outer gradients: the server receives each rank's float32
    seed, then one onebit frame (about 1/32 of float32) per round, and nothing else."""
    res, records = job
    from byteps import compression
    frame = compression.server_pipeline(compression.parse(
        {"compressor": "onebit", "ef": "vanilla"}), 64 * 32, 0, 0).frame_bytes
    # 60 steps, H = 10: 6 rounds push; finish()'s 7th has no steps left and pushes nothing
    assert res[0]["onebit"]["rounds"] == res[1]["onebit"]["rounds"] == 7
    rounds = 6
    for name, n in (("onebit.w1", 64 * 32), ("onebit.b2", 10)):
        got = sum(r["by_tensor"].get(name, 0) for r in records)
        f = compression.server_pipeline(compression.parse(
            {"compressor": "onebit", "ef": "vanilla"}), n, 0, 0).frame_bytes
        assert got == 2 * (n * 4 + rounds * f), (name, got, rounds, f)
    assert frame < 64 * 32 * 4 / 25                  # onebit: about 32x fewer bytes
    assert res[0]["onebit"]["acc"] > 0.5, res[0]["onebit"]


@pytest.mark.timeout(160)
def test_join_with_uneven_steps_ends_identical(job):
    """Rank 1 takes 5 steps, rank 0 11 (H = 3): rank 0's later rounds go on without it,
    then finish() pushes what each rank has left and both end with the servers' model."""
    res, _ = job
    a, b = res[0]["join"], res[1]["join"]
    assert a["last"] == b["last"] == 0
    assert a["p"] == b["p"] and all(np.isfinite(v).all() for v in a["p"].values())
    assert [e[2] for e in a["log"] if e[0] == "sync"][:3] == [3, 6, 9]
    assert [e[2] for e in b["log"] if e[0] == "sync"][:1] == [3]


@pytest.mark.timeout(120)
def test_one_host_without_servers_equals_the_replay_and_joins(tmp_path):
    """One host of 2 local ranks: the local reduction sums everything in shared memory
    and no server takes part; every rank applies the same outer step (the replay, bit
    for bit), and after an uneven join every rank takes the replica of the rank that
    joined last."""
    assert_ok(run_script("diloco_job.py", tmp_path, "replay,join", workers=2, servers=1,
                         timeout=110, BYTEPS_ENABLE_IPC=0))
    res = read_results(tmp_path)
    want, syncs = _replay(10, 3, 0.7, 0.9)
    for r in (0, 1):
        assert res[r]["replay"]["log"] == syncs
        for k in want:
            np.testing.assert_array_equal(np.array(res[r]["replay"]["p"][k], np.float32),
                                          want[k])
    assert res[0]["join"]["p"] == res[1]["join"]["p"]


@pytest.mark.timeout(160)
def test_inner_seconds_agrees_on_rounds_for_unequal_workers(job):
    """inner_seconds: rank 1 is ten times slower; both take the same rounds (agreed by the
    timer's control exchange), rank 0 takes more inner steps, both end identical."""
    res, _ = job
    a, b = res[0]["seconds"], res[1]["seconds"]
    assert a["rounds"] == b["rounds"] >= 4
    assert [e[1] for e in a["log"]] == [e[1] for e in b["log"]]      # the same fragments
    assert a["log"][-1][2] > 2 * b["log"][-1][2], (a["log"], b["log"])
    assert a["p"] == b["p"]
    a, b = res[0]["secjoin"], res[1]["secjoin"]      # rank 1 joins half-way: no hang
    assert a["last"] == b["last"] == 0 and a["rounds"] > b["rounds"] and a["p"] == b["p"]


@pytest.mark.timeout(200)
def test_elastic_worker_loss_then_server_loss_with_replicas(tmp_path):
    """3 workers, --min-workers 2: the last rank dies at step 12 (the group re-forms and
    every rank starts again from the servers' global parameters: a second seed round),
    then a server at step 25 (BYTEPS_SERVER_REPLICAS=1: its backup ran the same outer
    steps on its own copy).  Both survivors end identical and the model learned.  (A run
    without the server's death ends within 1e-6 of this one: the backup held the
    parameters and the momentum; measured by hand, not repeated here for CI time.)"""
    res = run_job([sys.executable, str(SCRIPTS / "diloco_elastic.py"), str(tmp_path), "40",
                   "12", "25"], workers=3, servers=2, timeout=190,
                  launcher_args=("--min-workers", "2"), BYTEPS_ENABLE_IPC=0,
                  BYTEPS_HEARTBEAT_INTERVAL=0.2, BYTEPS_SERVER_REPLICAS=1,
                  BYTEPS_PARTITION_BYTES=16)
    assert_ok(res)
    assert "its backup server takes over" in res.stderr, res.stderr[-3000:]
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    a, b = out[0], out[1]
    assert a["size"] == b["size"] == 2 and a["w"] == b["w"]
    assert a["restarts"] == 2, a                 # the first round after each formation
    assert a["loss"] < 0.2 * a["loss0"], a


def test_ranks_with_different_outer_settings_get_an_error_naming_both():
    """The server's declaration check (byteps/server/decls.py) on its own: the same key
    declared with another outer optimizer fails the key for every worker, naming the
    tensor, both ranks and the fix; a plain asynchronous declaration has no outer."""
    from byteps.server.decls import Tensors
    from byteps.transport.wire import Op

    class Checks(Tensors):                  # the sends a server's Tensors makes, kept
        def __init__(self):
            super().__init__(None, {b"w0": {}, b"w1": {}}, self.keep)
            self.sent = []

        def keep(self, ident, op, body, payload=()):
            self.sent.append((ident, op, body))
    c = Checks()
    c.declare([7, "DiLoCo.w", [4], 0, 0, [], 0, [0.7, 0.9, True]], {"rank": 0, "host_id": "a"})
    assert c.decls[7]["outer"] == (0.7, 0.9, True)
    c.declare([7, "DiLoCo.w", [4], 0, 1, [], 0, [0.5, 0.9, True]], {"rank": 1, "host_id": "b"})
    err = c.decls[7]["error"]
    assert "'DiLoCo.w'" in err and "rank 1" in err and "rank 0" in err and "outer_lr" in err
    assert {(i, op) for i, op, _ in c.sent} == {(b"w0", Op.DATA_ERROR), (b"w1", Op.DATA_ERROR)}
    c.declare([8, "AsyncParam.w", [4], 0, 0, []], {"rank": 0, "host_id": "a"})
    assert c.decls[8]["outer"] is None

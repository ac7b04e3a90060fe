"""Deterministic summation on the server (byteps.server.tree): a synchronous round's
result has the same bits whatever order its pushes arrive in.

Pure logic first (every arrival order of 3..6 pushers, joined ranks, compression, AVG,
float16 summed in float32, min/max, buffer reuse), then real 4-worker jobs whose
workers sleep differently before each push: their final parameters are bit-identical.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from byteps.compression import parse, server_pipeline, worker_pipeline
from byteps.server.store import Slot, apply, recheck
from byteps.server.tree import leaf_positions
from byteps.transport.wire import AVG, COMP, DTYPE_CODE, PULL, PUSH, Entry, average

N = 257


def pushes(n: int, dtype=np.float32, seed: int = 0) -> list[np.ndarray]:
    """Values of very different magnitudes: their float sum depends on the order."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(N) * 10.0 ** rng.integers(-4, 5, N)).astype(dtype)
            for _ in range(n)]


def run_round(arrs, order, joined=(), dtype=np.float32, flags=0, size=0, op=0, pipe=None,
              slot=None, rnd=0, leaves=None):
    """Push ``arrs[r]`` for each rank r of ``order`` (joined ranks never push); returns
    what rank ``order[0]`` pulls and the slot."""
    code = DTYPE_CODE[np.dtype(dtype)]
    if slot is None:
        slot = Slot(5, 0, code, N, -1, pipe, op)
    nworkers, joined = len(arrs), frozenset(joined)
    out: dict = {}
    for r in order:
        if r in joined:
            continue
        e = Entry(5, 0, rnd, PUSH | PULL | flags | (COMP if pipe else 0), code, N)
        apply(slot, e, arrs[r], r, b"w%d" % r, nworkers, out, joined, size,
              None if leaves is None else leaves[r])
    (_, res), = [x for x in out[b"w%d" % [r for r in order if r not in joined][0]]]
    return (res.copy() if isinstance(res, np.ndarray) else bytes(res)), slot


def tree_sum(arrs: list, op=np.add):
    """The reference: the fixed binary tree over positions 0..n-1 (absent: None)."""
    level = list(arrs)
    while len(level) > 1:
        if len(level) % 2:
            level.append(None)
        level = [a if b is None else b if a is None else op(a, b)
                 for a, b in zip(level[::2], level[1::2])]
    return level[0]


def bits(a) -> bytes:
    return a.tobytes() if isinstance(a, np.ndarray) else a


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_every_arrival_order_gives_the_same_bits(n):
    arrs = pushes(n)
    want = tree_sum(arrs)
    got = {bits(run_round(arrs, order)[0]) for order in itertools.permutations(range(n))}
    assert got == {want.tobytes()}
    # the check can fail: a running sum in arrival order differs between orders
    seq = {bits((arrs[a] + arrs[b]) + arrs[c]) for a, b, c in itertools.permutations(range(3))}
    assert len(seq) > 1


@pytest.mark.parametrize("n,joined", [(4, {1}), (5, {0, 3}), (6, {5}), (3, {2})])
def test_joined_ranks_never_arrive_and_the_order_still_does_not_matter(n, joined):
    arrs = pushes(n, seed=n)
    want = tree_sum([None if r in joined else a for r, a in enumerate(arrs)])
    got = {bits(run_round(arrs, o, joined)[0]) for o in itertools.permutations(range(n))}
    assert got == {want.tobytes()}


def test_a_join_that_completes_a_waiting_round():
    """Ranks 0, 1, 3 pushed; rank 2 joins later: recheck finishes the round (its root may
    be complete before the round) with the same bits as the tree without rank 2."""
    arrs = pushes(4, seed=9)
    want = tree_sum([arrs[0], arrs[1], None, arrs[3]]).tobytes()
    for order in itertools.permutations((0, 1, 3)):
        slot = Slot(5, 0, 0, N, -1)
        out: dict = {}
        for r in order:
            apply(slot, Entry(5, 0, 0, PUSH | PULL, 0, N), arrs[r], r, b"w%d" % r, 4, out)
        assert not out
        assert recheck(slot, 4, frozenset({2}), out) == 1
        assert {bits(a) for items in out.values() for _, a in items} == {want}


@pytest.mark.parametrize("name,params", [("int8", {"compressor": "int8", "bucket": 64}),
                                         ("fp16", {"fp16": True})])
def test_compressed_partitions_are_deterministic(name, params):
    n, spec = 5, parse(params)
    frames = []
    for r, g in enumerate(pushes(n, seed=3)):
        f = worker_pipeline(spec, N, 5, 0).compress(g / 1000, 0)
        frames.append(np.frombuffer(bytes(f), np.uint8))
    got = {bits(run_round(frames, o, pipe=server_pipeline(spec, N, 5, 0))[0])
           for o in itertools.permutations(range(n))}
    assert len(got) == 1, name


def test_average_is_the_workers_rule_on_the_tree_sum():
    arrs = pushes(5, seed=4)
    want = np.empty(N, np.float32)
    average(tree_sum(arrs), 5, want)
    for o in itertools.permutations(range(5)):
        res, _ = run_round(arrs, o, flags=AVG, size=5)
        assert res.tobytes() == want.tobytes()


def test_float16_is_summed_in_float32_and_rounded_once():
    arrs = pushes(3, np.float16, seed=5)
    exact = (arrs[0].astype(np.float32) + arrs[1].astype(np.float32)) + \
        arrs[2].astype(np.float32)
    want = tree_sum([a.astype(np.float32) for a in arrs]).astype(np.float16)
    got = {bits(run_round(arrs, o, dtype=np.float16)[0])
           for o in itertools.permutations(range(3))}
    assert got == {want.tobytes()}
    # Horovod's test_horovod_allreduce: 3 equal float16 tensors sum to tensor * 3 exactly
    x = pushes(1, np.float16, seed=6)[0]
    x = np.clip(x, -1000, 1000).astype(np.float16)
    res, _ = run_round([x, x, x], (2, 0, 1), dtype=np.float16)
    assert res.dtype == np.float16 and res.tobytes() == (x * np.float16(3)).tobytes()
    # rounding once differs from a float16 running sum for some of these values
    assert exact.astype(np.float16).tobytes() == want.tobytes()
    assert not np.array_equal(want, (arrs[0] + arrs[1]) + arrs[2])
    avg, _ = run_round(arrs, (1, 2, 0), dtype=np.float16, flags=AVG, size=3)
    ref = np.empty(N, np.float16)
    average(want, 3, ref)
    assert avg.tobytes() == ref.tobytes()


@pytest.mark.parametrize("op", [1, 2, 3])
def test_min_max_product_do_not_depend_on_the_order(op):
    arrs = pushes(4, seed=7)
    for a in arrs:
        a[:8] = [0.0, -0.0, 0.0, -0.0, np.nan, 1.0, -1.0, 2.0]
    ufunc = (None, np.minimum, np.maximum, np.multiply)[op]
    want = tree_sum(arrs, ufunc)
    got = {bits(run_round(arrs, o, op=op)[0]) for o in itertools.permutations(range(4))}
    assert got == {want.tobytes()}


def test_buffers_are_reused_round_after_round():
    """Partial sums go into the result buffer and a small pool, allocated once."""
    arrs = pushes(8, seed=8)
    slot, seen = None, set()
    rng = np.random.default_rng(1)
    for rnd in range(12):
        order = list(rng.permutation(8))
        res, slot = run_round(arrs, order, slot=slot, rnd=rnd)
        assert res.tobytes() == tree_sum(arrs).tobytes()
        for rs in slot.rounds.values():
            assert not rs.nodes
        seen |= {id(b) for b in slot.pool.free}
        assert len(slot.pool.free) <= 3
    assert len(seen) <= 3 and all(id(b) in seen for b in slot.pool.free)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pushes_the_server_owns_take_the_partial_sums(dtype):
    """``writable`` pushes (socket frames) hold partial sums in place: same bits, no pool
    buffer (float16 sums need float32 buffers: the pushes stay as they are)."""
    arrs = pushes(6, dtype, seed=11)
    want = run_round(arrs, range(6), dtype=dtype)[0].tobytes()
    code = DTYPE_CODE[np.dtype(dtype)]
    for order in itertools.permutations(range(6)):
        own = [a.copy() for a in arrs]
        slot, out = Slot(5, 0, code, N, -1), {}
        for r in order:
            apply(slot, Entry(5, 0, 0, PUSH | PULL, code, N), own[r], r, b"w%d" % r, 6, out,
                  writable=True)
        (_, res), = out[b"w%d" % order[0]]
        assert res.tobytes() == want
        assert slot.pool.free == [] if dtype == np.float32 else len(slot.pool.free) <= 3
        if dtype == np.float16:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(own, arrs))


def test_leaf_positions_follow_ranks_or_hosts():
    ws = [{"rank": r, "host_id": f"h{r // 2}"} for r in (3, 0, 2, 1)]
    assert leaf_positions(ws, "off") == {0: 0, 1: 1, 2: 2, 3: 3}
    assert leaf_positions(ws, "root") == {0: 0, 1: 0, 2: 1, 3: 1}
    arrs = pushes(2, seed=2)
    a, _ = run_round(arrs + arrs, (0, 2), joined=(1, 3), leaves={0: 0, 1: 0, 2: 1, 3: 1})
    assert a.tobytes() == (arrs[0] + arrs[0]).tobytes()


# ---------------------------------------------------------------- real jobs

def _train(tmp_path, name: str, seed: int, steps: int = 8, script="deterministic_train.py",
           workers: int = 4, launcher_args: tuple = (), **env):
    from conftest import read_results, run_script
    out = tmp_path / name
    out.mkdir()
    res = run_script(script, out, steps, seed, workers=workers, servers=2, timeout=150,
                     launcher_args=launcher_args, BYTEPS_PARTITION_BYTES=131072, **env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    ranks = read_results(out)
    assert len(ranks) == workers and len({v["digest"] for v in ranks.values()}) == 1, ranks
    return np.load(out / "params.npz")


@pytest.mark.timeout(240)
def test_four_workers_in_two_arrival_orders_end_bit_identical(tmp_path):
    """4 workers, 2 servers; different per-rank sleeps before each push reorder the
    arrivals; the final parameters (float32, float16, fp16-compressed) are identical."""
    a = _train(tmp_path, "first", 1)
    b = _train(tmp_path, "second", 2)
    for k in a.files:
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.timeout(240)
def test_four_workers_survive_a_server_sigkill_bit_identical(tmp_path):
    """BYTEPS_SERVER_REPLICAS=1, 4 workers: rank 0 SIGKILLs the last server at step 6; the
    backup sums the resent pushes in its own arrival order, and the final parameters
    equal an undisturbed run's (without replication) bit for bit."""
    ref = _train(tmp_path, "undisturbed", -1, steps=14, script="failover_train.py",
                 BYTEPS_HEARTBEAT_INTERVAL=0.3)
    got = _train(tmp_path, "killed", 6, steps=14, script="failover_train.py",
                 BYTEPS_HEARTBEAT_INTERVAL=0.3, BYTEPS_SERVER_REPLICAS=1)
    from conftest import read_results
    assert read_results(tmp_path / "killed")[0].get("killed")
    for k in ref.files:
        assert ref[k].tobytes() == got[k].tobytes(), k


@pytest.mark.ci_full
@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["root", "slice"])
def test_local_reduction_on_three_hosts_is_deterministic(tmp_path, mode):
    """3 hosts x 2 local ranks: the servers' tree runs over hosts (one push per host and
    partition); two jitters give the same bits."""
    lay = ("--hosts", "3", "--local-size", "2")
    a = _train(tmp_path, "first", 1, steps=5, workers=6, launcher_args=lay,
               BYTEPS_LOCAL_REDUCE=mode)
    b = _train(tmp_path, "second", 2, steps=5, workers=6, launcher_args=lay,
               BYTEPS_LOCAL_REDUCE=mode)
    for k in a.files:
        assert a[k].tobytes() == b[k].tobytes(), k

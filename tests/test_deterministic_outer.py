"""Deterministic sums of DiLoCo's outer rounds (byteps.server.outer) and of the local
reduction's float16 sums (byteps.core.local.stages).

The outer key's pushes are summed along the same fixed tree as a synchronous round
(byteps.server.tree): every arrival order of 3..5 pushers gives the same global
parameters bit for bit, float32, float16 (summed in float32, rounded once) and
int8-compressed, with no allocation per round in steady state.  A real 4-worker DiLoCo
job run with two different per-rank jitters ends bit-identical.  Three local ranks'
float16 sum is the float32 sum rounded once.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from byteps.common.outer import outer_step
from byteps.compression import parse, server_pipeline, worker_pipeline
from byteps.server.outer import Outer
from byteps.server.staleness import AsyncStore
from byteps.server.store import Slot
from byteps.transport.wire import ASYNC, COMP, DTYPE_CODE, PULL, PUSH, Entry

N = 129
LR, MU = 0.7, 0.9


def deltas(n: int, rnd: int, dtype=np.float32) -> list[np.ndarray]:
    """Outer gradients of very different magnitudes: their sum depends on the order."""
    rng = np.random.default_rng([n, rnd])
    return [(rng.standard_normal(N) * 10.0 ** rng.integers(-4, 4, N)).astype(dtype)
            for _ in range(n)]


def tree_sum(arrs: list):
    """The reference: the fixed binary tree over positions 0..n-1 (absent: None)."""
    level = list(arrs)
    while len(level) > 1:
        if len(level) % 2:
            level.append(None)
        level = [a if b is None else b if a is None else a + b
                 for a, b in zip(level[::2], level[1::2])]
    return level[0]


def run(n: int, orders, dtype=np.float32, pipe=None, spec=None, leaves=None, slot=None):
    """A seed round (rank 0's parameters, the others' zeros, raw) then one outer round per
    order, through AsyncStore.apply as the server calls it; returns the slot."""
    code = DTYPE_CODE[np.dtype(dtype)]
    if slot is None:
        slot = Slot(7, 0, code, N, -1, pipe)
        slot.outer = Outer(LR, MU, True)
    store, ranks = AsyncStore(0), set(range(n))
    seed = [np.linspace(-1, 1, N).astype(dtype)] + [np.zeros(N, dtype)] * (n - 1)
    rounds = [(0, range(n), seed)] + [(r + 1, o, deltas(n, r, dtype))
                                      for r, o in enumerate(orders)]
    for rnd, order, arrs in rounds:
        for rank in order:
            flags = PUSH | PULL | ASYNC
            arr = arrs[rank]
            if pipe is not None and rnd > 0:
                frame = worker_pipeline(spec, N, 7, 0).compress(arr.astype(np.float32), rnd)
                arr = slot.unpack(np.frombuffer(bytes(frame), np.uint8), rnd)
                flags |= COMP
            out: dict = {}
            store.apply(slot, Entry(7, 0, rnd, flags, code, N), arr, rank, b"w", ranks, out,
                        None if leaves is None else leaves[rank])
    return slot


def replay(n: int, rounds: int, dtype=np.float32, leaves=None) -> np.ndarray:
    """One process: the tree sum over the positions (``leaves``: rank -> position; float32
    for float16, rounded once) and outer_step."""
    x = np.linspace(-1, 1, N).astype(dtype)
    m = np.zeros_like(x)
    acc = np.float32 if dtype == np.float16 else dtype
    pos = leaves or {r: r for r in range(n)}
    for r in range(rounds):
        d = deltas(n, r, dtype)
        at = [d[[k for k in range(n) if pos[k] == p][0]] for p in range(n)]
        g = tree_sum([a.astype(acc) for a in at]).astype(dtype)
        outer_step(x, m, g, LR, MU, True)
    return x


def orders(n: int, rounds: int, seed: int):
    rng = np.random.default_rng(seed)
    return [list(rng.permutation(n)) for _ in range(rounds)]


@pytest.mark.parametrize("n", [3, 4, 5])
def test_every_arrival_order_of_an_outer_round_gives_the_same_parameters(n):
    want = replay(n, 1).tobytes()
    got = {run(n, [o]).value.tobytes() for o in itertools.permutations(range(n))}
    assert got == {want}
    # the check can fail: the previous arrival-order sum differs between orders
    d = deltas(n, 0)
    seq = {((np.zeros(N, np.float32) + d[a]) + d[b] + d[c]).tobytes()
           for a, b, c in itertools.permutations(range(3))}
    assert len(seq) > 1


def test_several_rounds_float16_compressed_and_local_reduction_positions():
    """Three outer rounds in random orders; float16 summed in float32 and rounded once;
    int8-compressed pushes (the decompression scratch is copied while it waits for its
    sibling); with local reduction the leaf is the host, whichever rank pushes."""
    want = replay(5, 3).tobytes()
    for seed in range(12):
        assert run(5, orders(5, 3, seed)).value.tobytes() == want
    want16 = replay(5, 2, np.float16)
    got16 = {run(5, orders(5, 2, s), np.float16).value.tobytes() for s in range(12)}
    assert got16 == {want16.tobytes()}
    spec = parse({"compressor": "int8", "bucket": 32})
    comp = {run(5, orders(5, 2, s), pipe=server_pipeline(spec, N, 7, 0),
                spec=spec).value.tobytes() for s in range(12)}
    assert len(comp) == 1
    leaves = {0: 0, 1: 2, 2: 1, 3: 3}       # ranks 1 and 2 on each other's host position
    host = {run(4, orders(4, 2, s), leaves=leaves).value.tobytes() for s in range(6)}
    assert host == {replay(4, 2, leaves=leaves).tobytes()} != {replay(4, 2).tobytes()}


def test_outer_rounds_reuse_their_buffers():
    """Partial sums, the rounded sum and the step's work array are allocated once."""
    slot = run(4, orders(4, 2, 0))
    o, store = slot.outer, AsyncStore(0)
    fixed = (o.g, o.work, o.m, slot.value)
    pool = {id(b): b for b in o.pool.free}
    for rnd in range(3, 12):
        for rank in np.random.default_rng(rnd).permutation(4):
            store.apply(slot, Entry(7, 0, rnd, PUSH | ASYNC, 0, N), deltas(4, rnd)[rank],
                        int(rank), b"w", set(range(4)), {})
        assert o.steps == rnd and not o.tree.nodes and not o.tree.leaves
        assert all(a is b for a, b in zip(fixed, (o.g, o.work, o.m, slot.value)))
        pool.update({id(b): b for b in o.pool.free})
    assert len(pool) <= 1 and all(id(b) in pool for b in o.pool.free)


# ---------------------------------------------------------------- local reduction

def test_three_local_ranks_sum_float16_in_float32_rounded_once():
    from byteps.core.local.stages import RowSum
    rng = np.random.default_rng(3)
    rows = [(rng.standard_normal(4096) * 10.0 ** rng.integers(-3, 4, 4096)).astype(np.float16)
            for _ in range(3)]
    dst = np.empty(4096, np.float16)
    rowsum = RowSum()
    rowsum(rows, dst)
    want = ((rows[0].astype(np.float32) + rows[1]) + rows[2]).astype(np.float16)
    assert dst.tobytes() == want.tobytes()
    assert not np.array_equal(dst, (rows[0] + rows[1]) + rows[2])   # the check can fail
    scratch = rowsum.f32
    rowsum([r[:100] for r in rows], dst[:100])     # a shorter chunk: the same scratch
    assert dst[:100].tobytes() == want[:100].tobytes() and rowsum.f32 is scratch
    rowsum(rows[:2], dst)                          # two rows: one rounding anyway
    assert dst.tobytes() == (rows[0] + rows[1]).tobytes()
    rowsum(rows, dst, np.maximum)                  # other ops: unchanged
    assert dst.tobytes() == np.maximum(np.maximum(rows[0], rows[1]), rows[2]).tobytes()


# ---------------------------------------------------------------- a real job

@pytest.mark.timeout(240)
def test_four_worker_diloco_job_in_two_arrival_orders_ends_bit_identical(tmp_path):
    """4 workers, 2 servers, DiLoCo H = 2 with Nesterov: different per-rank sleeps before
    each outer push reorder the arrivals; the final parameters are identical."""
    from conftest import read_results, run_script
    got = []
    for seed in (1, 2):
        out = tmp_path / f"j{seed}"
        out.mkdir()
        res = run_script("deterministic_diloco.py", out, 6, seed, workers=4, servers=2,
                         timeout=150, BYTEPS_PARTITION_BYTES=65536)
        assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
        ranks = read_results(out)
        assert len(ranks) == 4 and len({v["digest"] for v in ranks.values()}) == 1, ranks
        got.append(np.load(out / "params.npz"))
    for k in got[0].files:
        assert got[0][k].tobytes() == got[1][k].tobytes(), k

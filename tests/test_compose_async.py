"""Issue 24: asynchronous training and join() compose with compression and local
reduction.  Real multi-process jobs under bpslaunch, each with a timeout, plus the
server's pure rules (joined hosts, staleness per host) without sockets.

* AsyncPS pushes compressed parameter deltas (onebit + error feedback): the servers add
  each push at once to their full-precision parameters and answer them uncompressed;
* with local reduction (``--hosts 2 --local-size 2``) the host's local root pushes the
  host's sum of deltas; sync onebit + EF learns there too;
* join() with uneven steps on ``--hosts 2 --local-size 2`` equals the one-process replay
  in which joined ranks add zeros (tests/test_join.py's reference), bit for bit.
"""
import json
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_ok, read_results, run_job, run_script
from test_join import _reference

ONEBIT_EF = json.dumps({"compressor": "onebit", "ef": "vanilla"})
LOCAL = ("--hosts", "2", "--local-size", "2")
NOIPC = {"BYTEPS_ENABLE_IPC": 0}
COMPRESS_ALL = {"BYTEPS_MIN_COMPRESS_BYTES": 0}     # the MLP's small tensors too


def _train(tmp_path, mode, comp, local=False, **env):
    res = run_script("compose_async.py", tmp_path, mode, comp, workers=4 if local else 2,
                     servers=2 if local else 1, timeout=280,
                     launcher_args=LOCAL if local else (), **env)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == list(range(4 if local else 2)), res.stderr[-3000:]
    return out


def _learned(out, compressed: bool, local: bool = False) -> None:
    """Every rank well above chance (10 classes), identical parameters after finish(),
    and the pushing ranks sent compressed bytes when asked."""
    for r, o in out.items():
        assert o["acc"] > 0.8, (r, o)
    assert len({o["digest"] for o in out.values()}) == 1, out
    pushers = [o for r, o in out.items() if not local or r % 2 == 0]   # local roots
    for o in pushers:
        assert o["raw_bytes"] > 0, o
        if compressed:
            assert o["wire_bytes"] * 10 < o["raw_bytes"], o      # onebit: ~1/32 + scales
        else:
            assert o["wire_bytes"] == o["raw_bytes"], o
    if local:      # the other local ranks never talk to the servers
        assert all(o["raw_bytes"] == 0 for r, o in out.items() if r % 2), out


@pytest.mark.timeout(300)
def test_torch_async_with_onebit_ef_learns_digits(tmp_path):
    """BYTEPS_ENABLE_ASYNC=1 + compression_params: the optimizer's AsyncPS compresses its
    deltas (was refused: 'not available with BYTEPS_ENABLE_ASYNC=1')."""
    out = _train(tmp_path, "torch", ONEBIT_EF, BYTEPS_ENABLE_ASYNC=1, **COMPRESS_ALL, **NOIPC)
    assert all(o["algorithm"].startswith("AsyncPS") and "onebit" in o["algorithm"]
               for o in out.values()), out
    _learned(out, compressed=True)


@pytest.mark.timeout(300)
def test_numpy_async_with_compression(tmp_path):
    """byteps.numpy: raw asynchronous push_pulls of a compressed name add up exactly (fp16
    of small integers), and the numpy DistributedOptimizer with
    AsyncPS(compression_params=onebit+EF) learns."""
    out = _train(tmp_path, "numpy", ONEBIT_EF, BYTEPS_ENABLE_ASYNC=1, **COMPRESS_ALL, **NOIPC)
    assert all(o["raw"] == 3 * (1 + 2) for o in out.values()), out
    _learned(out, compressed=True)


@pytest.mark.timeout(300)
def test_async_training_learns_with_local_reduction(tmp_path):
    """--hosts 2 --local-size 2, BYTEPS_ENABLE_ASYNC=1: each host's deltas are summed in
    shared memory and its local root pushes them (was refused: 'set
    BYTEPS_LOCAL_REDUCE=0')."""
    out = _train(tmp_path, "torch", "none", local=True, BYTEPS_ENABLE_ASYNC=1)
    _learned(out, compressed=False, local=True)


@pytest.mark.timeout(300)
def test_async_onebit_with_local_reduction_numpy(tmp_path):
    """Async + onebit/EF + local reduction, through byteps.numpy: 4 ranks' raw pushes sum
    to 3 * (1 + 2 + 3 + 4) on every rank, training learns, only the roots push."""
    out = _train(tmp_path, "numpy", ONEBIT_EF, local=True, BYTEPS_ENABLE_ASYNC=1,
                 **COMPRESS_ALL)
    assert all(o["raw"] == 3 * (1 + 2 + 3 + 4) for o in out.values()), out
    _learned(out, compressed=True, local=True)


@pytest.mark.timeout(300)
def test_sync_onebit_ef_learns_with_local_reduction(tmp_path):
    """Synchronous onebit + EF on --hosts 2 --local-size 2: full precision inside a host,
    compressed between hosts."""
    out = _train(tmp_path, "sync", ONEBIT_EF, local=True, **COMPRESS_ALL)
    assert all(o["algorithm"] == "SyncPS" for o in out.values()), out
    _learned(out, compressed=True, local=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("steps,mode,ipc", [
    ([10, 15, 20, 25], "root", 0),     # host 0's local root joins first, keeps pushing
    ([15, 10, 25, 20], "slice", 1),    # non-roots first; every local rank pushes a slice
])
def test_join_with_local_reduction_matches_replay(tmp_path, steps, mode, ipc):
    """join() with uneven steps on --hosts 2 --local-size 2 equals the one-process replay
    in which joined ranks add zeros (was refused: 'join() is not available with local
    reduction'); join() returns the last rank to join on every rank."""
    res = run_job([sys.executable, str(SCRIPTS / "join_uneven.py"), str(tmp_path), "join",
                   ",".join(map(str, steps))], workers=4, servers=2, timeout=280,
                  launcher_args=LOCAL, BYTEPS_ENABLE_IPC=ipc, BYTEPS_LOCAL_REDUCE=mode,
                  BYTEPS_PARTITION_BYTES=300000)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2, 3]
    last = steps.index(max(steps))
    assert {o["last"] for o in out.values()} == {last}, out
    ref = _reference(steps)
    for r, o in out.items():
        for name, w in ref.items():
            got = np.array(o["params"][name], np.float32)
            assert np.array_equal(got, w), (r, name, np.abs(got - w).max())
    assert len({str(o["params"]["w.onebit"]) for o in out.values()}) == 1


# rank 3 (host 1's second rank) joins first, then host 0's root is last; then a root
# first and rank 0 last (the feature matrix's order); then host 0's second rank last
MANY_JOINS = [[5, 8, 11, 3], [11, 3, 6, 8], [6, 11, 3, 8]]


def _many_reference(cells) -> dict:
    """The one-process replay of tests/scripts/join_many.py: per cell, the sum over the
    ranks that still have data divided by the number of ranks, then one step of all."""
    from test_join import LR, _grad
    n = len(cells[0])
    sizes = {"small": 37, "big": 200_000}
    out = {"keep": np.zeros(3000, np.float32)}
    for i, steps in enumerate(cells):
        for name, size in [(f"c{i}.{k}", v) for k, v in sizes.items()] + [("keep", 3000)]:
            w = out.get(name, np.zeros(size, np.float32))
            for s in list(range(max(steps))) + [1000 + i]:
                total = np.zeros(size, np.float32)
                for r in range(n):
                    if s < steps[r] or s == 1000 + i:
                        total += _grad(r, s, size)
                w = w - LR * np.divide(total, np.float32(n))
            out[name] = w
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["root", "slice"])
def test_many_joins_with_local_reduction_match_replay(tmp_path, mode):
    """Several uneven join()s in one job on --hosts 2 --local-size 2 (another rank joins
    first each time, new tensor names in every cell, a tensor kept across them, training
    on after each join): every rank equals the replay bit for bit.  A local rank that
    returned from join() first used to start the next cell while its peer still waited for
    JOIN_DONE as a joined rank, which then failed the new names ('never pushed the tensor
    of key ...') and the job stalled."""
    cells = ";".join(",".join(map(str, c)) for c in MANY_JOINS)
    res = run_job([sys.executable, str(SCRIPTS / "join_many.py"), str(tmp_path), cells],
                  workers=4, servers=2, timeout=280, launcher_args=LOCAL,
                  BYTEPS_LOCAL_REDUCE=mode, BYTEPS_PARTITION_BYTES=300000, **NOIPC)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2, 3]
    lasts = [c.index(max(c)) for c in MANY_JOINS]
    assert all(o["last"] == lasts for o in out.values()), out
    ref = _many_reference(MANY_JOINS)
    for r, o in out.items():
        for name, w in ref.items():
            got = np.array(o["params"][name], np.float32)
            assert np.array_equal(got, w), (r, name, np.abs(got - w).max())
    for i in range(len(MANY_JOINS)):           # compressed between hosts: equal everywhere
        assert len({str(o["params"][f"c{i}.onebit"]) for o in out.values()}) == 1


def test_joined_hosts_and_staleness_groups_without_sockets():
    """The server's rules: with local reduction a host counts as joined (once, by its
    root) only when every local rank joined, and staleness is bounded per host."""
    from byteps.server.staleness import AsyncStore
    from byteps.server.store import Slot, async_groups, counted_joined
    from byteps.transport.wire import ASYNC, PULL, PUSH, Entry
    ws = [{"rank": r, "host_id": f"h{r // 2}", "local_rank": r % 2} for r in range(4)]
    assert counted_joined({1}, ws, "root") == frozenset()
    assert counted_joined({0, 1, 3}, ws, "root") == frozenset({0})
    assert counted_joined({0, 1, 3}, ws, "slice") == frozenset({0})
    assert counted_joined({1, 3}, ws, "off") == frozenset({1, 3})
    assert async_groups(ws, "root", {0, 1}, {}) == {"h1": [2, 3]}
    assert async_groups(ws, "root", {1}, {}) == {"h0": [0, 1], "h1": [2, 3]}
    assert async_groups(ws, "off", {1}, {3: "left"}) == {0: [0], 2: [2]}
    st, slot = AsyncStore(staleness=0), Slot(1, 0, 0, 2, -1)
    one = np.ones(2, np.float32)
    groups = async_groups(ws, "root", set(), {})
    out: dict = {}
    st.apply(slot, Entry(1, 0, 0, PUSH | PULL | ASYNC, 0, 2), one, 0, b"a", groups, out)
    assert not out                     # host h1 (rank 2, its root) has not pushed round 0
    st.apply(slot, Entry(1, 0, 0, PUSH | PULL | ASYNC, 0, 2), one, 2, b"c", groups, out)
    assert sorted(out) == [b"a", b"c"] and out[b"a"][0][1].tolist() == [2.0, 2.0]


def test_async_compressed_single_process():
    """One process without servers: an asynchronous push_pull of a compressed name keeps
    the value locally, as an uncompressed one does (no refusal)."""
    from byteps.core import api
    api.init()
    try:
        p = {"compressor": "onebit", "ef": "vanilla"}
        a = api.push_pull(np.ones(4, np.float32), "c", average=False, compression_params=p,
                          asynchronous=True)
        b = api.push_pull(np.ones(4, np.float32), "c", average=False, asynchronous=True)
        assert a.tolist() == [1.0] * 4 and b.tolist() == [2.0] * 4
        with pytest.raises(ValueError, match="uncompressed=True"):
            api.push_pull_async(np.ones(2, np.float32), "s", uncompressed=True)
    finally:
        api.shutdown()


def test_server_wire_checks_of_compressed_async_pushes():
    """COMP + ASYNC: a compressed delta must have the compressor's exact frame size; a raw
    push is accepted on a compressed key only when asynchronous (an exact seed/zeros,
    whose length the frame decoder already checked); a compressed push to an
    uncompressed key is still dropped."""
    from byteps import compression
    from byteps.server.decls import Tensors
    from byteps.server.store import Slot
    from byteps.transport.wire import ASYNC, COMP, PULL, PUSH, Entry

    class Drops:
        def __init__(self):
            self.said = []

        def warn(self, what, detail):
            self.said.append(f"{what}: {detail}")

    chk = Tensors(Drops(), {}, None)
    chk.decls[7] = {"name": "w"}
    spec = compression.parse({"compressor": "onebit", "ef": "vanilla"})
    slot = Slot(7, 0, 0, 1000, -1, compression.server_pipeline(spec, 1000, 7, 0))
    frame = np.zeros(slot.pipe.frame_bytes, np.uint8)
    raw = np.zeros(1000, np.float32)
    ok = Entry(7, 0, 0, PUSH | PULL | COMP | ASYNC, 0, 1000)
    assert chk.comp_ok(slot, ok, frame, 0)
    assert not chk.comp_ok(slot, ok, frame[:-1], 0)                 # truncated frame
    assert chk.comp_ok(slot, Entry(7, 0, 0, PUSH | PULL | ASYNC, 0, 1000), raw, 0)
    assert not chk.comp_ok(slot, Entry(7, 0, 0, PUSH | PULL, 0, 1000), raw, 0)   # sync: raw
    plain = Slot(7, 1, 0, 1000, -1)
    assert not chk.comp_ok(plain, Entry(7, 1, 0, PUSH | PULL | COMP | ASYNC, 0, 1000),
                           frame, 0)
    assert len(chk.drops.said) == 3 and all("'w'" in s for s in chk.drops.said)

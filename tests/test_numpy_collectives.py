"""Horovod's collectives through byteps.numpy (tests/scripts/coll_numpy.py): every op and
dtype against numpy references, async handles, and errors that name the ranks, in real
jobs of 2 and 3 workers; plus the dtype carrying rules without sockets."""
from __future__ import annotations

import numpy as np
import pytest

from byteps.core.collective.carry import carry, reduction
from tests.conftest import assert_ok, read_results, run_script


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.uint32, np.uint64, np.bool_,
                                   np.complex64, np.complex128])
def test_carry_copies_exactly(dtype):
    a = (np.arange(12).reshape(3, 4) * 7 - 20).astype(dtype)
    wire, back = carry(a, copy=True)
    assert wire.dtype.name in ("int32", "int64", "uint8", "float32", "float64")
    assert wire.shape[0] == a.shape[0]              # rows stay rows (allgather, alltoall)
    got = back(wire)
    assert got.dtype == a.dtype and np.array_equal(got, a)


def test_carry_reductions_wrap_like_the_dtype():
    a = np.array([30000, -30000], np.int16)
    wire, back = carry(a, copy=False)
    assert wire.dtype == np.int32
    assert np.array_equal(back(wire + wire), a + a)   # int16 arithmetic wraps the same way
    b = np.array([True, False])
    wire, wop, avg, back = reduction(b, 0, True)        # bool: uint8, reduced logically
    assert wire.dtype == np.uint8 and (wop, avg) == (2, False)    # "any": max
    assert back(wire).dtype == np.bool_ and reduction(b, 3, False)[1] == 1  # product: min
    assert carry(np.ones(2, np.uint64), copy=False)[0].dtype == np.uint64  # refused by name


@pytest.mark.parametrize("workers,servers,layout", [
    (2, 1, ()), (3, 2, ()),
    # local reduction: min/max/product reduce element-wise in shared memory, then on the
    # servers across hosts (2 x 2), or only in shared memory (one host, no server round)
    (4, 1, ("--hosts", "2", "--local-size", "2")), (2, 1, ("--hosts", "1", "--local-size", "2"))],
    ids=["2w", "3w-2s", "2x2-local", "1x2-local"])
def test_numpy_collectives_in_a_job(tmp_path, workers, servers, layout):
    res = run_script("coll_numpy.py", tmp_path, workers=workers, servers=servers,
                     timeout=120, launcher_args=layout, BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == list(range(workers))
    common = [c for c in done[0] if not c.startswith("set ")]    # process-set members only
    assert all([c for c in d if not c.startswith("set ")] == common for d in done.values())
    for check in ("build info", "product int16", "prescale/postscale int32",
                  "allreduce_async", "postscale float16", "average float16",
                  "reducescatter avg float16", "allgather bool", "broadcast complex64 from 1",
                  "reducescatter average", "alltoall splits", "allgather shape error",
                  "broadcast root error", "alltoall splits error", "allreduce shape error",
                  "collectives work after errors", "barrier", "broadcast_object",
                  "allgather_object", "broadcast_object unencodable"):
        assert check in done[0], check
    import byteps.numpy as bps
    if workers == 3 and hasattr(bps, "add_process_set"):   # a set of ranks 0 and 2
        assert "set alltoall" in done[0] and "set alltoall" in done[2]
        assert not any(c.startswith("set ") for c in done[1])


def test_a_joined_local_rank_adds_the_identity_of_the_op():
    """Under local reduction a rank inside join() contributes to its host's reductions: a
    zero to a sum, but the dtype's extreme to a minimum/maximum and a one to a product."""
    from byteps.core.local.stages import identity
    x = np.array([-3.5, 2.0], np.float32)
    for op, ufunc in ((0, np.add), (1, np.minimum), (2, np.maximum), (3, np.multiply)):
        for dt in (np.float32, np.float16, np.int16, np.uint8):
            v = x.astype(dt)
            assert np.array_equal(ufunc(v, identity(op, v.shape, dt)), v), (op, dt)

"""Horovod's collectives (byteps.core.collective.ops + byteps.torch): rules without sockets,
then real jobs of 2 and 3 workers checked against numpy references."""
from __future__ import annotations

import json

import numpy as np
import pytest

from byteps.core.collective import ops as coll
from byteps.server import store
from byteps.transport import wire
from tests.conftest import assert_ok, read_results, run_script


def test_resolve_op():
    assert coll.resolve_op() == (0, True)
    assert coll.resolve_op(average=False) == (0, False)
    assert coll.resolve_op(op=coll.SUM) == (0, False)
    assert coll.resolve_op(op=coll.AVERAGE) == (0, True)
    assert [coll.resolve_op(op=o)[0] for o in (coll.MIN, coll.MAX, coll.PRODUCT)] == [1, 2, 3]
    assert coll.resolve_op(op="max") == (2, False)
    assert coll.resolve_op(op=coll.ADASUM) == (-1, False)      # adasum.py combines it
    with pytest.raises(ValueError, match="Adasum is not supported for reducescatter"):
        coll.resolve_op(op=coll.ADASUM, kind="reducescatter")
    with pytest.raises(ValueError, match="either"):
        coll.resolve_op(average=True, op=coll.SUM)
    with pytest.raises(ValueError, match="unknown"):
        coll.resolve_op(op="median")


def test_scale_keeps_dtype():
    i = np.array([3, -3, 7], np.int32)
    assert coll.scale(i, 0.5).dtype == np.int32
    assert coll.scale(i, 0.5).tolist() == [1, -1, 3]           # float64, truncated
    h = np.array([1.5], np.float16)
    assert coll.scale(h, 3.0).dtype == np.float16 and coll.scale(h, 3.0)[0] == 4.5
    assert coll.scale(i, 1.0) is i


def test_reducescatter_rows():
    assert coll.reducescatter_rows(7, 3) == [(0, 3), (3, 2), (5, 2)]
    assert coll.reducescatter_rows(2, 3) == [(0, 1), (1, 1), (2, 0)]


def test_declaration_carries_the_op():
    ok = [[1, "t", [2], 0, 0, [], 2]]
    wire._check_entries([[], ok])
    wire._check_entries([[], [[1, "t", [2], 0, 0, []]]])        # sum: the old form
    for bad in ([1, "t", [2], 0, 0, [], 4], [1, "t", [2], 0, 0, [], "max"]):
        with pytest.raises(wire.WireError, match="declaration"):
            wire._check_entries([[], [bad]])


@pytest.mark.parametrize("op,ref", [(1, np.minimum), (2, np.maximum), (3, np.multiply)])
def test_server_reduces_with_the_declared_op(op, ref):
    slot = store.Slot(1, 0, 0, 3, -1, None, op)
    a, b, c = (np.array(v, np.float32) for v in ([1, 5, -2], [3, 2, -4], [2, 2, 2]))
    out: dict = {}
    for rank, x in enumerate((a, b, c)):
        store.apply(slot, wire.Entry(1, 0, 0, wire.PUSH | wire.PULL, 0, 3), x.copy(), rank,
                    b"w%d" % rank, 3, out)
    got = out[b"w0"][0][1]
    assert np.array_equal(got, ref(ref(a, b), c))


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)])
def test_horovod_collectives_in_a_job(tmp_path, workers, servers):
    res = run_script("torch_collectives.py", tmp_path, workers=workers, servers=servers,
                     timeout=240, BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == list(range(workers))
    assert all(d == done[0] for d in done.values())
    for check in ("alltoall splits", "reducescatter sum", "allgather shape error",
                  "broadcast root error", "alltoall splits error", "min torch.int32",
                  "prescale torch.int32", "allgather name reused, new shape",
                  "collectives work after errors"):
        assert check in done[0], json.dumps(done[0])

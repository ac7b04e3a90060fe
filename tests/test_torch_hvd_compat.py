"""Horovod compatibility of byteps.torch (tests/scripts/hvd_torch_compat.py): names reused
with new shapes, duplicate names, autograd of every collective, SyncBatchNorm, sparse
gradients, process sets of 2 of 3 ranks, and errors that name ranks without hanging; with
3 workers and with 2 local ranks reducing through shared memory (--local-size 2)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from byteps.core.collective import process_sets
from tests.conftest import assert_ok, read_results, run_script

ALWAYS = ["HOROVOD_RANK/SIZE", "duplicate allgather name", "name free after sync",
          "int prescale/postscale dtype", "allgather grad", "alltoall grad",
          "reducescatter grad", "SyncBatchNorm input grad", "SyncBatchNorm running_var",
          "sparse_allreduce_async", "sparse embedding step", "allreduce shape error",
          "allreduce same-size shape error",
          "collectives work after errors"]
SET_MEMBERS = ["set allreduce", "set max", "set allgather", "set broadcast",
               "set reducescatter", "set alltoall", "set grouped_allreduce",
               "set shape error names global ranks", "set works after error",
               "set allgather grad", "set optimizer keeps members equal",
               "set allgather_object"]
SET_ALL = ["global after set ops", "add_process_set disagreement", "remove_process_set"]


@pytest.mark.parametrize("workers,launcher_args", [
    (3, ()), (2, ("--hosts", "1", "--local-size", "2"))], ids=["3workers", "local2"])
def test_horovod_compat_in_a_job(tmp_path, workers, launcher_args):
    res = run_script("hvd_torch_compat.py", tmp_path, workers=workers, servers=2,
                     timeout=150, launcher_args=launcher_args, BYTEPS_ENABLE_IPC=0)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == list(range(workers))
    for r, checks in done.items():
        want = list(ALWAYS) + (["join zeros 1-d", "join zeros 2-d"] if r else [])
        if workers >= 3:        # the set is the first and the last rank
            want += SET_ALL + (SET_MEMBERS if r in (0, workers - 1) else ["non-member refused"])
        missing = [c for c in want if c not in checks]
        assert not missing, f"rank {r}: {missing}\n{json.dumps(checks)}"


def test_process_set_rules_without_a_job():
    import byteps.torch as hvd
    hvd.init()                        # a local job of one worker
    try:
        with pytest.raises(ValueError, match="distinct"):
            hvd.add_process_set([0, 0])
        with pytest.raises(ValueError, match="out of range"):
            hvd.add_process_set([0, 3])
        with pytest.raises(ValueError, match="global process set"):
            hvd.add_process_set([0])
        assert hvd.global_process_set.process_set_id == 0
        assert hvd.global_process_set.included() and hvd.global_process_set.size() == 1
        assert not hvd.remove_process_set(hvd.global_process_set)
        with pytest.raises(ValueError, match="not registered"):
            hvd.allreduce(torch.ones(2), process_set=process_sets.ProcessSet([0]))
        # a name reused with another layout in a local job
        a = hvd.allreduce(torch.ones(3), name="re", op=hvd.Sum)
        b = hvd.allreduce(torch.ones(2, 2, dtype=torch.int64), name="re", op=hvd.Sum)
        assert a.shape == (3,) and b.dtype == torch.int64 and b.shape == (2, 2)
        sp = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.tensor([2.0]), (3,))
        out = hvd.synchronize(hvd.sparse_allreduce_async(sp, "sp1", hvd.Average))
        assert np.array_equal(out.to_dense().numpy(), [0, 2.0, 0])
        x = torch.randn(4, 3, 2, requires_grad=True)
        y = hvd.SyncBatchNorm(3)(x)
        ref = torch.nn.BatchNorm1d(3)(x)
        assert torch.allclose(y, ref, atol=1e-6)
    finally:
        hvd.shutdown()


FAILURES = ["allgather shape", "broadcast dtype", "broadcast root", "bad root",
            "reducescatter op", "duplicate name"]


def test_a_failed_collective_leaves_the_job_usable(tmp_path):
    """tests/scripts/hvd_failures.py: shape, dtype, root and op mismatches, a duplicate name,
    an allgather while a rank is in join(), one rank's own timeout inside a collective
    the other never makes, broadcast_object of an unsupported object on the root only and
    a retry, and with BYTEPS_COLLECTIVE_TIMEOUT_S different names on the ranks (allreduce,
    allgather), a rank that raised between two collectives, a rank later than the
    timeout and a handle left in flight at shutdown(); after each, 20 collectives of
    every kind succeed on every rank, and the ranks are back from shutdown()/init()
    within seconds."""
    res = run_script("hvd_failures.py", tmp_path, workers=2, servers=1, timeout=120)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1]
    for r, out in done.items():
        checks = out["checks"]
        want = FAILURES + [c for c in ("allgather while joined", "own timeout") if r == 1] + \
            (["peer's timeout fails the barrier"] if r == 0 else [])
        want += ["unsupported broadcast_object", "handle left in flight",
                 "20 collectives after a handle left in flight at shutdown() and its timeout",
                 "allreduce names differ",
                 "allgather names differ", "raised between", "late rank"]
        want += [f"20 collectives after {t}" for t in (
            "start", "shape mismatch", "dtype mismatch", "root mismatch", "op mismatch",
            "duplicate name", "allgather while joined", "a rank's timeout and shutdown()/init()",
            "unsupported broadcast_object and a retry", "different names",
            "different allgather names", "a rank raised between two collectives",
            "a rank later than the timeout")]
        missing = [c for c in want if c not in checks]
        assert not missing, f"rank {r}: {missing}\n{json.dumps(checks)}"
        assert out["reinit_s"] < 15, out
        # BYTEPS_COLLECTIVE_TIMEOUT_S=0.5: from the failing call to the job usable again
        assert all(s < 15 for s in out["timeout_s"].values()), out


def test_a_set_member_that_leaves_is_named_at_once(tmp_path):
    """tests/scripts/hvd_set_departure.py (3 workers, set [0, 1]): a member that calls
    shutdown(), the set's leader that does, and a member that leaves on its own
    BYTEPS_COLLECTIVE_TIMEOUT_S: the other member's set operation fails at once naming
    it; every rank's shutdown() + init() makes the set and the job usable again."""
    res = run_script("hvd_set_departure.py", tmp_path, workers=3, servers=1, timeout=120,
                     BYTEPS_COLLECTIVE_TIMEOUT_S=1, BYTEPS_REINIT_WAIT_S=1)
    assert_ok(res)
    done = read_results(tmp_path)
    assert sorted(done) == [0, 1, 2]
    usable = [f"{t}: usable" for t in ("start", "after member left", "after leader left",
                                       "after a timeout", "after shutdown() and init()")]
    own = {0: ["member left", "late member"], 1: ["leader left", "own timeout"], 2: []}
    for r, out in done.items():
        missing = [c for c in usable + own[r] if c not in out["checks"]]
        assert not missing, f"rank {r}: {missing}\n{json.dumps(out)}"
        sec = out["seconds"]
        assert all(sec[c] < 1 for c in ("member left", "late member", "leader left")
                   if c in sec), out                  # at once, not a timeout or a grace
        assert sec["reinit"] < 5, out


@pytest.mark.timeout(150)
def test_optimizers_of_process_sets_take_uneven_steps(tmp_path):
    """DistributedOptimizer(process_set=...) on some ranks only, each set its own number
    of steps, onebit, 2 hosts x 2, autotune on: every set's members end identical and
    nothing waits.  Before, each step also counted for autotune, whose step-end exchanges
    are the whole job's: rank 0's hung for the ranks that took fewer steps."""
    res = run_script("torch_set_steps.py", tmp_path, workers=4, timeout=100,
                     launcher_args=("--hosts", "2", "--local-size", "2"))
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2, 3]
    assert out[0]["cross-host"] == out[2]["cross-host"] and \
        out[0]["same-host"] == out[1]["same-host"], out
    assert out[3] == {} and "same-host" not in out[2] and "cross-host" not in out[1]

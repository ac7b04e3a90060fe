"""A process-set member that leaves the job (shutdown(), or its own wait's timeout) is
named at once to the members waiting for it on that set, as on the global set (3
workers, set [0, 1], rank 2 outside it); every rank then calls shutdown() + init() and
the set works again (tests/test_torch_hvd_compat.py).

Writes rank<r>.json: {"checks": [...], "seconds": {case: time to the error}} to argv[1]."""
import json
import os
import sys
import time

import torch

import byteps.torch as hvd

out = {"checks": [], "seconds": {}}
hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == 3


def fails(case, fn, *match):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:           # noqa: BLE001 (the type is checked below)
        assert isinstance(exc, hvd.HorovodInternalError), (case, type(exc), exc)
        assert all(m in str(exc) for m in match), (case, str(exc))
        out["seconds"][case] = time.monotonic() - t0
        out["checks"].append(case)
        return
    raise AssertionError(f"{case}: no error on rank {r}")


def usable(tag):
    ps = hvd.add_process_set([0, 1])
    for i in range(10):
        x = torch.full((4,), float(r + i))
        if r in (0, 1):
            got = hvd.allreduce(x, op=hvd.Sum, process_set=ps, name=f"{tag}.s{i}")
            assert torch.equal(got, torch.full((4,), float(1 + 2 * i))), (tag, i, got)
        got = hvd.allreduce(x, op=hvd.Sum, name=f"{tag}.g{i}")
        assert torch.equal(got, torch.full((4,), float(3 + 3 * i))), (tag, i, got)
    out["checks"].append(f"{tag}: usable")
    return ps


def again():
    hvd.shutdown()
    hvd.init()


ps = usable("start")
# 1. a member (rank 1) leaves; the leader (rank 0) waits for it on the set
if r == 1:
    hvd.shutdown()
elif r == 0:
    fails("member left", lambda: hvd.allreduce(torch.ones(3), process_set=ps, name="a"),
          "rank 1", "left")
again()
ps = usable("after member left")
# 2. the leader (rank 0) leaves; a member (rank 1) waits for its reply
if r == 0:
    hvd.shutdown()
elif r == 1:
    fails("leader left", lambda: hvd.allreduce(torch.ones(3), process_set=ps, name="b"),
          "rank 0", "left")
again()
ps = usable("after leader left")
# 3. a member waits on the set past its own BYTEPS_COLLECTIVE_TIMEOUT_S (set below) while
# the other member is late: the waiting one leaves, the late one's next operation on the
# set fails at once naming it
if os.environ.get("BYTEPS_COLLECTIVE_TIMEOUT_S"):
    if r == 1:
        fails("own timeout", lambda: hvd.allreduce(torch.ones(3), process_set=ps, name="c"),
              "BYTEPS_COLLECTIVE_TIMEOUT_S")
    elif r == 0:
        time.sleep(float(os.environ["BYTEPS_COLLECTIVE_TIMEOUT_S"]) + 1.5)
        try:        # rank 1's part arrived before it left: this one may complete
            hvd.allreduce(torch.ones(3), process_set=ps, name="c")
        except hvd.HorovodInternalError as exc:
            assert "rank 1" in str(exc) and "left" in str(exc), str(exc)
        fails("late member", lambda: hvd.allreduce(torch.ones(3), process_set=ps, name="d"),
              "rank 1", "left")
    again()
    usable("after a timeout")
# 4. shutdown() + init() at once is back within seconds
hvd.shutdown()
t0 = time.monotonic()
hvd.init()
out["seconds"]["reinit"] = time.monotonic() - t0
usable("after shutdown() and init()")
hvd.shutdown()
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(out, f)

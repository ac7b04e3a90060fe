"""Worker script for core behaviours; the mode is argv[1]."""
import json
import os
import sys
import time

import numpy as np
import zmq

import byteps.numpy as bps
from byteps.core import api

mode, out_dir = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
res = {"rank": r}

if mode == "mismatch":
    shape = (10,) if r == 0 else (12,)
    t0 = time.monotonic()
    try:
        bps.push_pull(np.ones(shape, np.float32), name="layer1.weight")
        res["error"] = None
    except bps.BytePSError as exc:
        res["error"] = str(exc)
    res["seconds"] = time.monotonic() - t0
elif mode == "async":
    for _ in range(3):
        bps.push_pull(np.ones(4, np.float32), name="w", average=False)
    bps.barrier()
    res["value"] = bps.push_pull(np.zeros(4, np.float32), name="w", average=False).tolist()
elif mode == "scalar":
    y = bps.push_pull(np.array(r + 1.0), name="scalar", average=False)
    res["scalar"] = [list(y.shape), float(y)]
    z = np.array(float(r))
    api.push_pull(z, "scalar.inplace", average=False, out=z)
    res["inplace"] = [list(z.shape), float(z)]
    t = np.arange(12, dtype=np.float32).reshape(3, 4).T * (r + 1)   # not contiguous
    res["transposed"] = bps.push_pull(t, name="t", average=False).tolist()
elif mode == "broadcast_reinit":
    root = n - 1
    b = bps.broadcast(np.arange(6, dtype=np.float64) * (r + 1), root_rank=root, name="p")
    res["bcast"] = b.tolist()
    bps.shutdown()
    bps.init()
    res["rank_after"] = bps.rank()
    res["sum_after"] = bps.push_pull(np.full(3, r + 1, np.int64), name="after",
                                     average=False).tolist()
    bps.barrier()
elif mode == "priority":
    # submit all seven before the engine takes any (it would otherwise be free to send the
    # first low ones while this loaded machine is still submitting: its loop also looks
    # every 100 ms without a wake-up, so holding the wake-up back is not enough)
    eng = api._STATE.engine
    take = eng.take_pending
    eng.take_pending = lambda: None
    low = [bps.push_pull_async(np.ones(1024, np.float32), name=f"low{i}", priority=0)
           for i in range(6)]
    high = bps.push_pull_async(np.ones(1024, np.float32), name="high", priority=10)
    eng.take_pending = take
    eng.wake()
    for h in low + [high]:
        bps.synchronize(h)
elif mode == "garbage":
    ctx = zmq.Context.instance()
    targets = [s["address"] for s in api._STATE.book["servers"]]
    cfg = api.get_config()
    targets.append(f"tcp://{cfg.root_uri}:{cfg.root_port}")
    if r == 0:
        socks = []
        for addr in targets:
            s = ctx.socket(zmq.DEALER)
            s.connect(addr)
            socks.append(s)
            s.send(b"garbage")                                  # single frame
            s.send_multipart([b"\x93\x01\x02", b""])            # bad msgpack header
            s.send_multipart([b"\x97\x01\xa1x\x01\x14\x00\x01\x90", b""])  # wrong version/job
            import msgpack
            hdr = msgpack.packb([1, cfg.job_id, 1, 20, 1, 5, [[[1, 0, 0, 3, 0, 100]], []]])
            s.send_multipart([hdr, b"", b"short"])              # truncated payload, no mac
            s.send_multipart([b"\x00" * (2 << 20), b""])        # oversize header
    total = np.zeros(50_000, np.float32)
    for step in range(20):
        y = bps.push_pull(np.full(50_000, r + step, np.float32), name="g", average=False)
        total += y
    exp = sum(np.full(50_000, k + s, np.float32) for k in range(n) for s in range(20))
    res["ok"] = bool(np.array_equal(total, exp))
elif mode == "kill":
    bps.push_pull(np.ones(10, np.float32), name="a")
    if r == 1:
        os.kill(os.getpid(), 9)
    for i in range(1000):
        bps.push_pull(np.ones(10, np.float32), name="a")
        time.sleep(0.01)
elif mode == "stall":
    if r == 1:
        time.sleep(3.5)
    bps.push_pull(np.ones(10, np.float32), name="slow.tensor")
json.dump(res, open(os.path.join(out_dir, f"rank{r}.json"), "w"))

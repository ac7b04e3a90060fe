"""Worker script: uneven data with join() (Horovod semantics), or a rank that leaves.

    join_uneven.py OUT_DIR join STEPS,STEPS,...     rank r trains STEPS[r] steps, then join()
    join_uneven.py OUT_DIR leave|exit STEPS,STEPS   rank r stops after STEPS[r] steps and
                                                    calls shutdown() (leave) or just exits 0

Gradients are small multiples of 1/4 (float32 sums are exact in any order), so the test
can compare with a single-process reference bit for bit.
"""
import json
import os
import sys
import time

import numpy as np

import byteps.numpy as bps

out_dir, mode, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
bps.init()
r, n = bps.rank(), bps.size()
assert n == len(steps), (n, steps)
LR = np.float32(0.5)
# (name, elements, compression_params): with BYTEPS_PARTITION_BYTES=300000, two tensors
# cut into partitions on 2 servers, partly over the server's inline limit (summed on engine
# threads), one compressed with fp16 (exact here), one with onebit
TENSORS = [("w.small", 37, None), ("w.parts", 120_000, None), ("w.big", 200_000, None),
           ("w.fp16", 3000, {"compressor": "fp16"}), ("w.onebit", 2000, {"compressor": "onebit"})]


def grad(rank: int, step: int, size: int) -> np.ndarray:
    return (((np.arange(size) * (rank + 1) + 3 * step) % 17) - 8).astype(np.float32) / 4


params = {name: np.zeros(size, np.float32) for name, size, _ in TENSORS}


def step(s: int) -> None:
    hs = [(name, bps.push_pull_async(grad(r, s, size), name=f"g.{name}",
                                     compression_params=comp))
          for name, size, comp in TENSORS]
    for name, h in hs:
        params[name] -= LR * bps.synchronize(h)


res: dict = {"rank": r}
if mode == "join":
    for s in range(steps[r]):
        step(s)
    if r == 0:           # the others push round 10 and wait: join() must finish those rounds
        time.sleep(0.5)
    t0 = time.time()
    res["last"] = bps.join()
    res["join_s"] = time.time() - t0
    bps.barrier()
    for name in params:             # Horovod's pattern: the last rank holds every step
        params[name] = bps.broadcast(params[name], root_rank=res["last"], name=f"p.{name}")
    step(1000)                      # after join(): every rank trains together again
    res["params"] = {k: v.tolist() for k, v in params.items()}
else:
    try:
        for s in range(steps[r]):
            step(s)
        res["error"] = None
    except bps.BytePSError as exc:
        res["error"], res["error_at"] = str(exc), time.time()
        json.dump(res, open(os.path.join(out_dir, f"rank{r}.json"), "w"))
        raise
    res["left_at"] = time.time()
json.dump(res, open(os.path.join(out_dir, f"rank{r}.json"), "w"))
if mode != "exit":
    bps.shutdown()

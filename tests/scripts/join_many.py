"""Worker script: several uneven join()s in one job, training on after each.

    join_many.py OUT_DIR STEPS;STEPS;...      STEPS = "s0,s1,...": rank r trains s_r steps
                                               of that cell, then join()

Each cell pushes its own new tensor names (``c<i>.*``) plus one tensor kept across every
cell (``keep``); after each join() every rank takes the parameters of the rank that
joined last (a broadcast) and trains one more step together (step 1000 + i).  Gradients are small multiples of 1/4 (float32 sums exact in any order):
tests/test_compose_async.py replays the job in one process bit for bit.
"""
import json
import os
import sys

import numpy as np

import byteps.numpy as bps

out_dir = sys.argv[1]
cells = [[int(s) for s in c.split(",")] for c in sys.argv[2].split(";")]
bps.init()
r, n = bps.rank(), bps.size()
assert all(len(c) == n for c in cells), (n, cells)
LR = np.float32(0.5)
# (name, elements, compression): with BYTEPS_PARTITION_BYTES=300000 "big" is cut in
# partitions; "onebit" is compressed between hosts
TENSORS = [("small", 37, None), ("big", 200_000, None), ("onebit", 2000, {"compressor": "onebit"})]
KEEP = 3000


def grad(rank: int, step: int, size: int) -> np.ndarray:
    return (((np.arange(size) * (rank + 1) + 3 * step) % 17) - 8).astype(np.float32) / 4


params = {"keep": np.zeros(KEEP, np.float32)}


def step(i: int, s: int) -> None:
    todo = [(f"c{i}.{name}", size, comp) for name, size, comp in TENSORS] + [("keep", KEEP, None)]
    hs = [(name, bps.push_pull_async(grad(r, s, size), name=f"g.{name}",
                                     compression_params=comp)) for name, size, comp in todo]
    for name, h in hs:
        params[name] = params.get(name, 0) - LR * bps.synchronize(h)


res: dict = {"rank": r, "last": []}
for i, steps in enumerate(cells):
    for s in range(steps[r]):
        step(i, s)
    last = bps.join()
    res["last"].append(last)
    for name in params:             # Horovod's pattern: the last rank holds every step
        params[name] = bps.broadcast(params[name], root_rank=last, name=f"p{i}.{name}")
    step(i, 1000 + i)               # after join(): every rank trains together again
res["params"] = {k: v.tolist() for k, v in params.items()}
json.dump(res, open(os.path.join(out_dir, f"rank{r}.json"), "w"))
bps.shutdown()

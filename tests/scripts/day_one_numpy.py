"""Worker script (numpy) for tests/test_user_day_one.py: what a new user checks first.

    day_one_numpy.py OUT_DIR

- compression on a small model: a large tensor is compressed (int8), two small ones and an
  integer one are not; rank 0 names them once (the test counts the notice), and the
  end-of-job summary shows the bytes on the wire;
- broadcast_object of an argparse.Namespace and a dataclass (Horovod's ``args = ...``);
- with one worker: every common call works without a server.
Writes OUT_DIR/rank<r>.json.
"""
import argparse
import dataclasses
import json
import os
import sys

import numpy as np

import byteps.numpy as bps


@dataclasses.dataclass
class Setup:
    lr: float
    dims: tuple
    init: np.ndarray


out_dir = sys.argv[1]
bps.init()
r, n = bps.rank(), bps.size()
from byteps.core import api  # noqa: E402
res = {"size": n, "communicates": api._STATE.engine is not None}

args = argparse.Namespace(lr=0.1 * (r + 1), epochs=3 + r, data=f"/d{r}")
args = bps.broadcast_object(args, root_rank=0)
res["args"] = vars(args)
setup = bps.broadcast_object(Setup(0.5, (8, 4), np.arange(3.0)) if r == 0 else None)
assert type(setup) is Setup and setup.dims == (8, 4) and setup.init.tolist() == [0, 1, 2]

params = {"compressor": "int8"}
rng = np.random.default_rng(r)
for step in range(4):
    big = rng.standard_normal(64 * 1024).astype(np.float32)          # 256 KB: compressed
    small = rng.standard_normal(100).astype(np.float32)              # 400 B: not
    bias = np.full(10, float(r), np.float32)                         # 40 B: not
    count = np.array([r + 1, 2], np.int64)                           # integer: not
    got = bps.push_pull(big, name="w.big", compression_params=params)
    assert got.shape == big.shape and np.isfinite(got).all()
    got = bps.push_pull(small, name="w.small", compression_params=params)
    assert np.allclose(bps.push_pull(bias, name="w.bias", compression_params=params),
                       np.mean(range(n)))
    tot = bps.push_pull(count, name="steps", average=False, compression_params=params)
    assert tot.tolist() == [n * (n + 1) // 2, 2 * n], tot
    bps.step_done()

# the rest of the common calls
assert bps.broadcast(np.arange(4.0) * (r + 1), root_rank=0, name="b").tolist() == [0, 1, 2, 3]
assert bps.allgather(np.array([r]), name="ag").tolist() == list(range(n))
assert float(bps.allreduce(np.array([1.0]), name="ar", op=bps.Sum)[0]) == n
assert bps.allgather_object({"r": r}) == [{"r": i} for i in range(n)]
bps.barrier()
res["last_joined"] = bps.join()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
bps.shutdown()

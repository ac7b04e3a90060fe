"""Autotune job for tests/test_autotune.py: push_pull a large and a small tensor for
``steps`` steps (explicit step_done), check every sum, and record per step the large
tensor's key and partition lengths and the tuner's choice into out_dir/rank<r>.json, with
the job's shared-memory files left at the end (keys autotune no longer uses are freed).

argv: out_dir steps nbytes
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

import byteps.numpy as bps
from byteps.core import api
from byteps.transport import shm


def main() -> None:
    out_dir, steps, nbytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    bps.init()
    r, n = bps.rank(), bps.size()
    big = np.arange(nbytes // 4, dtype=np.float32) + r
    small = np.full(1000, float(r + 1), np.float32)
    want_big = np.arange(nbytes // 4, dtype=np.float32) * n + n * (n - 1) / 2
    layouts, failures = [], []
    for step in range(steps):
        got = bps.push_pull(big, "autotune.big", average=False)
        got_small = bps.push_pull(small, "autotune.small", average=False)
        t = api._STATE.tensors["autotune.big"]
        layouts.append([step, t.key, [p[2] for p in t.parts]])
        if not np.array_equal(got, want_big) or not np.all(got_small == n * (n + 1) / 2):
            failures.append(step)
        bps.step_done()
    tu = api._STATE.tuner
    doc = {"rank": r, "layouts": layouts, "failures": failures,
           "choice": None if tu is None or tu.choice is None else list(tu.choice),
           "changes": None if tu is None else tu.changes,
           "initial": None if tu is None else tu.initial,
           "hold": None if tu is None else tu.hold, "state": None if tu is None else tu.state,
           "base_key": api.tensor_key("autotune.big"),
           "credit_bytes": api._STATE.engine.cfg.credit_bytes,
           "retired": None if tu is None or tu.retire is None else tu.retire.count,
           "shm_files": _job_files(api._STATE.cfg.job_id)}
    (out_dir / f"rank{r}.json").write_text(json.dumps(doc))
    bps.barrier()


def _job_files(job_id: str) -> list:
    folder = shm.shm_dir(os.environ.get("BYTEPS_SHM_DIR"))
    return sorted(f for f in os.listdir(folder) if f.startswith(shm.job_prefix(job_id)))


if __name__ == "__main__":
    main()

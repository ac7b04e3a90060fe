"""Autotune without step marks, for tests/test_autotune_initial.py: a numpy loop that
push_pulls two tensors per step and never calls step_done(); checks every sum and records
what autotune did (the probe at init, the inferred steps, the settings and when they
changed) into out_dir/rank<r>.json.

argv: out_dir steps nbytes [skew]

``skew``: then rank 0 pushes the big tensor again before a barrier and the other ranks
after it (Horovod's duplicate-name test does this): that push ends an inferred step on
each rank at a different point of the program, and autotune's exchange there must not
wait for the others (byteps/core/autotune/steps.py); three steps follow.
"""
import json
import sys
from pathlib import Path

import numpy as np

import byteps.numpy as bps
from byteps.core import api
from byteps.core.autotune import steps as tune_steps


def main() -> None:
    out_dir, steps, nbytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    bps.init()
    r, n = bps.rank(), bps.size()
    tu = api._STATE.tuner
    probed = {"initial": tu.initial, "credit": tu.credit0,
              "rows": [row for row in tu.rows if row[2] == "probe"]}
    big = np.arange(nbytes // 4, dtype=np.float32) + r
    small = np.full(1000, float(r + 1), np.float32)
    want_big = np.arange(nbytes // 4, dtype=np.float32) * n + n * (n - 1) / 2
    failures, cuts = [], []
    for step in range(steps):
        got = bps.push_pull(big, "infer.big", average=False)
        got_small = bps.push_pull(small, "infer.small", average=False)
        if not np.array_equal(got, want_big) or not np.all(got_small == n * (n + 1) / 2):
            failures.append(step)
        cuts.append([p[2] for p in api._STATE.tensors["infer.big"].parts])
    if sys.argv[4:] == ["skew"]:
        if r == 0:
            h = bps.push_pull_async(big, "infer.big", average=False)
        bps.barrier()
        if r != 0:
            h = bps.push_pull_async(big, "infer.big", average=False)
        bps.barrier()
        if not np.array_equal(bps.synchronize(h), want_big):
            failures.append("skew")
        for step in range(3):
            got = bps.push_pull(small, "infer.small", average=False)
            got_big = bps.push_pull(big, "infer.big", average=False)
            if not np.array_equal(got_big, want_big) or not np.all(got == n * (n + 1) / 2):
                failures.append(f"after skew {step}")
    tune_steps.settle(tu)      # the last inferred step's thread (its exchange is complete)
    doc = {"rank": r, "failures": failures, "probe": probed, "step": tu.step,
           "inferred": tu.names.count, "explicit": tu.names.explicit,
           "changes": tu.changes, "state": tu.state, "cuts": cuts,
           "choice": None if tu.choice is None else list(tu.choice)}
    (out_dir / f"rank{r}.json").write_text(json.dumps(doc))
    bps.barrier()


if __name__ == "__main__":
    main()

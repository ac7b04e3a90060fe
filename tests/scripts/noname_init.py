"""Unnamed calls realign at init() (2 workers, one job, no shutdown()).

Horovod's suites call ``init()`` at the start of every test and never ``shutdown()``; a
test that one rank leaves early (its own pytest timeout, an assertion on its own result)
leaves that rank's counters of unnamed calls behind the others'.  Here rank 1 starts
unnamed calls of every kind that rank 0 never makes (handles never synchronized), then
every rank calls ``init()`` again and runs 20 rounds of unnamed collectives of every
kind, each checked against every rank's input: none may meet rank 1's leftovers.

Writes rank<r>.json {"rounds": 20, "names": [...]} into argv[1]."""
import json
import sys
from pathlib import Path

import numpy as np

import byteps.numpy as bps
from byteps.core.collective.rules import auto_name

bps.init()
r, n = bps.rank(), bps.size()
if r == 1:        # the calls of a test only this rank got through (never synchronized)
    for i in range(3):
        bps.allreduce_async(np.full(4, 1000.0 + i), op=bps.Sum)
    bps.allgather_async(np.full((3, 2), 1000.0))
    bps.broadcast_async(np.full(3, 1000.0), root_rank=1)
    bps.reducescatter_async(np.full((2 * n,), 1000.0), op=bps.Sum)
bps.init()        # every rank, at the same point: the counters start again
names = [auto_name("probe")]
for i in range(20):
    a = bps.allreduce(np.full(4, float(r + i)), op=bps.Sum)
    assert np.array_equal(a, np.full(4, float(sum(range(n)) + n * i))), (i, a)
    g = bps.allgather(np.full((r + 1, 2), float(10 * r + i)))
    want = np.concatenate([np.full((k + 1, 2), float(10 * k + i)) for k in range(n)])
    assert np.array_equal(g, want), (i, g)
    b = bps.broadcast(np.full(3, float(100 * r + i)), root_rank=0)
    assert np.array_equal(b, np.full(3, float(i))), (i, b)
    s = bps.reducescatter(np.arange(2 * n, dtype=np.float64) + i, op=bps.Sum)
    assert np.array_equal(s, n * (np.arange(2 * r, 2 * r + 2, dtype=np.float64) + i)), (i, s)
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps({"rounds": 20, "names": names}))

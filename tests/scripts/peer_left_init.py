"""init() on a rank whose collective failed because another rank left re-forms the group
(2 workers, one job).

Horovod's suites call ``init()`` at the start of every test and never ``shutdown()``: when
one rank leaves the membership (its wait interrupted by the test's timeout, or
``shutdown()`` + ``init()``), the other learns it from its next collective ("... left the
job ... without pushing it"), and its next ``init()`` must join the re-formed group, else
the rank that left waits in ``init()`` until the job ends.  Rank 1 calls ``shutdown()`` and
``init()``; rank 0's allreduce fails naming it, rank 0 calls ``init()``, and 20 allreduces
then complete on both.  Writes rank<r>.json {"failed": message, "reinit_s": s} to argv[1]."""
import json
import sys
import time
from pathlib import Path

import numpy as np

import byteps.numpy as bps

bps.init()
r = bps.rank()
assert bps.allreduce(np.ones(3), op=bps.Sum, name="before")[0] == 2
failed, t0 = "", time.monotonic()
if r == 1:
    bps.shutdown()
    bps.init()
else:
    time.sleep(1.0)          # rank 1 has left by now
    try:
        bps.allreduce(np.ones(3), op=bps.Sum, name="after")
    except bps.BytePSError as exc:
        failed = str(exc)
    t0 = time.monotonic()
    bps.init()
reinit = time.monotonic() - t0
for i in range(20):
    got = bps.allreduce(np.full(3, float(r + i)), op=bps.Sum, name="after")
    assert np.array_equal(got, np.full(3, 1.0 + 2 * i)), (i, got)
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps({"failed": failed, "reinit_s": reinit}))

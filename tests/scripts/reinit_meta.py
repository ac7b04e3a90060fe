"""The original BytePS's meta_test.py pattern, cycle after cycle in one worker process.

Each cycle starts a scheduler and a server with ``bpslaunch`` in role mode, calls
init(), pushes a tensor, calls shutdown() and waits for the scheduler and the server to
exit before the next cycle.  argv: out_json cycles port [numpy|mxnet].  Writes per-cycle
timings.
"""
import json
import os
import secrets
import subprocess
import sys
import time

import numpy as np

out, cycles, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flavour = sys.argv[4] if len(sys.argv) > 4 else "numpy"
base = dict(os.environ, DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1",
            DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port,
            BYTEPS_FORCE_DISTRIBUTED="1", BYTEPS_PARTITION_BYTES="2147483647",
            BYTEPS_JOB_SECRET=os.environ.get("BYTEPS_JOB_SECRET") or secrets.token_hex(16))
os.environ.update(base, DMLC_ROLE="worker", DMLC_WORKER_ID="0", BYTEPS_LOCAL_RANK="0",
                  BYTEPS_LOCAL_SIZE="1")
if flavour == "mxnet":
    import mxnet as mx

    import byteps.mxnet as bps
else:
    import byteps.numpy as bps

cycle_docs = []
for it in range(cycles):
    t0 = time.monotonic()
    services = [subprocess.Popen([sys.executable, "-m", "byteps.launcher"],
                                 env=dict(base, DMLC_ROLE=role))
                for role in ("scheduler", "server")]
    bps.init()
    t_init = time.monotonic() - t0
    if flavour == "mxnet":                  # as the original's tests/test_mxnet.py
        bps.byteps_declare_tensor("tensor_0")
        t = mx.nd.ones((17, 17)) * (1.0 + it)
        bps.byteps_push_pull(t, name="tensor_0", is_average=False)
        y = t.asnumpy()
    else:
        y = bps.push_pull(np.full(17, 1.0 + it, np.float32), name="tensor_0", average=False)
    assert np.all(y == 1.0 + it), y
    bps.shutdown()
    t_down = time.monotonic()
    codes = [p.wait(timeout=120) for p in services]
    cycle_docs.append({"init_s": t_init, "exit_wait_s": time.monotonic() - t_down,
                       "codes": codes})
with open(out, "w") as f:
    json.dump(cycle_docs, f)

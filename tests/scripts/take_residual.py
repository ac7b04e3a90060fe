"""Worker for tests/test_compression.py::test_take_residual_moves_what_compression_left_unsent:
one onebit + error feedback push_pull of a few partitions, then ``api.take_residual``.

    take_residual.py OUT_DIR

Writes rank<r>.json: its input, what take_residual added, what it returned, whether every
residual it holds is zero afterwards, and its host; tests/test_compression.py checks them
against the compressor (a push's sent part is one magnitude per partition)."""
import json
import sys

import numpy as np

import byteps.numpy as bps
from byteps.core import api, state

bps.init()
r = bps.rank()
params = {"compressor": "onebit", "ef": "vanilla"}
x = np.random.default_rng(r).standard_normal(20000).astype(np.float32)
bps.push_pull(x, name="t", average=False, compression_params=params)
bps.push_pull(x[:10], name="plain", average=False)
st = state._state()
out = np.zeros_like(x)
got = api.take_residual("t", out)
held = st.tensors["t"].held() if st.local is None else st.local.cuts.held("t")
again = np.zeros_like(x)
res = {"x": x.tolist(), "out": out.tolist(), "got": got, "held": len(held),
       "zero_after": all(not p.residual.any() for _, p in held),
       "again": bool(api.take_residual("t", again)) and not again.any(),
       "unknown": api.take_residual("never pushed", np.zeros(3, np.float32)),
       "plain": api.take_residual("plain", np.zeros(10, np.float32)),
       "host": st.cfg.host_id.split("/")[0], "parts": len(st.tensors["t"].parts)}
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

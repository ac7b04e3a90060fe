"""Worker for tests/test_numpy_lr_ef.py: onebit + error feedback through byteps.numpy, two
rounds per name.  Name "const": lr 1.0 both rounds; "halved": lr 1.0 then 0.5 (the
residual of round 1 enters round 2 scaled by 2).  argv = out_dir.  Writes rank<r>.json."""
import json
import sys

import numpy as np

import byteps.numpy as bps

bps.init()
r = bps.rank()
params = {"compressor": "onebit", "ef": "vanilla"}
rng = np.random.default_rng(r)
x1, x2 = (rng.normal(size=1024).astype(np.float32) for _ in range(2))
res = {}
for name, lrs in (("const", (1.0, 1.0)), ("halved", (1.0, 0.5))):
    out = []
    for x, lr in zip((x1, x2), lrs):
        bps.set_compression_lr(lr)
        out.append(bps.push_pull(x, name=name, average=False,
                                 compression_params=params).tolist())
    res[name] = out
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

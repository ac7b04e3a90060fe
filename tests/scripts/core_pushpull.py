"""Worker script: push_pull every dtype and many sizes; write result digests per rank."""
import hashlib
import json
import sys

import numpy as np

import byteps.numpy as bps

out_dir = sys.argv[1]
order = sys.argv[2] if len(sys.argv) > 2 else "same"
bps.init()
r, n = bps.rank(), bps.size()
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
part_elems = 4096 // 4
SIZES = [1, 7, part_elems - 1, part_elems, part_elems + 3, 3 * part_elems + 1]
digests, failures = {}, []
jobs = [(dt, sz, avg) for dt in DTYPES for sz in SIZES for avg in (False, True)]
if order == "reverse" and r % 2 == 1:
    jobs = jobs[::-1]
handles = []
for dt, sz, avg in jobs:
    x = (np.arange(sz) % 7 + r + 1).astype(dt)
    name = f"t.{dt}.{sz}.{avg}"
    handles.append((name, dt, sz, avg, bps.push_pull_async(x, name=name, average=avg)))
for name, dt, sz, avg, h in handles:
    y = bps.synchronize(h)
    total = sum((np.arange(sz) % 7 + k + 1).astype(np.float64) for k in range(n))
    if avg:
        exp = (total.astype(dt) / n).astype(dt) if np.dtype(dt).kind == "f" else \
            (total.astype(dt) // n).astype(dt)
    else:
        exp = total.astype(dt)
    if y.dtype != np.dtype(dt) or y.shape != (sz,) or not np.array_equal(y, exp):
        failures.append(f"{name}: got {y[:5]} expected {exp[:5]}")
    digests[name] = hashlib.sha256(y.tobytes()).hexdigest()
# in place, 2-D
m = np.full((3, 5), float(r), dtype=np.float32)
bps.synchronize(bps._api.push_pull_async(m, "inplace", average=False, out=m))
if not np.array_equal(m, np.full((3, 5), float(sum(range(n))), np.float32)):
    failures.append(f"inplace: {m}")
json.dump({"digests": digests, "failures": failures},
          open(f"{out_dir}/rank{r}.json", "w"))
bps.shutdown()

"""Worker for tests/test_torch_hvd_compat.py::test_optimizers_of_process_sets_take_uneven_steps:
4 ranks (2 hosts x 2), each training as many steps as its sets give it: rank 0 a model
over set [0, 2] and then one over set [0, 1], ranks 1 and 2 one model each, rank 3 none
(autotune on, as by default).  Writes OUT_DIR/rank<r>.json: {set: weight digest}."""
import hashlib
import json
import sys

import torch

import byteps.torch as bps

a, b = bps.ProcessSet([0, 2]), bps.ProcessSet([0, 1])
bps.init(process_sets=[a, b])
r = bps.rank()
res = {}
for ps, name in ((a, "cross-host"), (b, "same-host")):
    if not ps.included():
        continue
    torch.manual_seed(0)
    m = torch.nn.Linear(5000, 1)
    opt = bps.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01),
        named_parameters=[(f"{name}.{k}", v) for k, v in m.named_parameters()],
        process_set=ps, compression_params={"compressor": "onebit", "ef": "vanilla"})
    x = torch.randn(32, 5000, generator=torch.Generator().manual_seed(r))
    for _ in range(30):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
    res[name] = hashlib.sha256(m.weight.detach().numpy().tobytes()).hexdigest()[:16]
bps.barrier()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

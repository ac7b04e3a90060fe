"""torch's loss scaling (``torch.amp.GradScaler``, the CPU one) over byteps, Horovod's
recipe (``synchronize()``, ``unscale_``, ``skip_synchronize()``): rank 1's loss overflows in
step 2 (tests/test_compression.py).

    torch_amp_nonfinite.py OUT_DIR none|onebit|procset

With onebit + error feedback, that rank's gradients cannot be compressed; the round's
result is NaN on every rank (wire.NONFINITE), as it is uncompressed, so every rank's
scaler sees the overflow, skips the step and halves its scale.  ``procset``: 4 ranks,
each DistributedOptimizer on a process set ([0, 2] and [1, 3]), onebit + error feedback
(the sets' own compressed allreduce), rank 2's loss inf in step 2: only [0, 2] skips it.
Writes
OUT_DIR/rank<r>.json: per step the scale and a digest of the parameters.
"""
import hashlib
import json
import sys

import torch

import byteps.torch as bps

out, comp = sys.argv[1], sys.argv[2]
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(200, 10)
extra = {"compression_params": {"compressor": "onebit", "ef": "vanilla"}} \
    if comp != "none" else {}
if comp == "procset":
    sets = [bps.add_process_set([0, 2]), bps.add_process_set([1, 3])]
    extra["process_set"] = sets[r % 2]
bad = 2 if comp == "procset" else 1           # the rank whose loss overflows
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), **extra)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
gen = torch.Generator().manual_seed(1 + r)
log = []
for step in range(6):
    x, y = torch.randn(32, 200, generator=gen), torch.randn(32, 10, generator=gen)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    if step == 2 and r == bad:
        loss = loss * float("inf")            # an overflow on one rank
    scaler.scale(loss).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    log.append([scaler.get_scale(), digest])
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(log, f)
bps.shutdown()

"""Timeline window with a broadcast before training (as every BytePS/Horovod script does).

argv: flavour (numpy | torch) steps.  Run with BYTEPS_TRACE_ON=1 and a trace window.
numpy: broadcast, then each step two push_pull_async + synchronize (steps end at the
synchronize that leaves nothing in flight).  torch: broadcast_parameters and
broadcast_optimizer_state, then DistributedOptimizer steps (steps end in step()).
"""
import sys

import numpy as np

flavour, steps = sys.argv[1], int(sys.argv[2])
if flavour == "numpy":
    import byteps.numpy as bps
    bps.init()
    w = bps.broadcast(np.full(1000, bps.rank(), np.float32), root_rank=0, name="w")
    for step in range(steps):
        hw = bps.push_pull_async(w * 0 + step, name="grad.w")
        hb = bps.push_pull_async(np.ones(4, np.float32), name="grad.b")
        bps.synchronize(hw)
        bps.synchronize(hb)
    bps.shutdown()
else:
    import torch

    import byteps.torch as bps
    bps.init()
    torch.manual_seed(bps.rank())
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    x = torch.ones(4, 8)
    for step in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    bps.shutdown()

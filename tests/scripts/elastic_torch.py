"""Elastic worker (PyTorch): the digits MLP with bps.elastic.TorchState and bps.elastic.run.

    elastic_torch.py OUT STEPS KILL_STEP ADD_STEP [cb]

Step s trains on the same 128 samples whatever the number of workers (each rank takes
its share and scales its loss so that the average over the ranks is the full batch's
mean), so an elastic run is comparable with an undisturbed one.  With KILL_STEP >= 0
the last rank lowers the discovery file to 3 slots and SIGKILLs itself after its
backward pass of that step (gradients in flight); at ADD_STEP rank 0 raises it to 4 and
waits until the new worker is about to register.  Run without bpslaunch it is the undisturbed
single-process reference.  ``cb``: the optimizer is a CrossBarrier (the updates of a step
still in flight when a rank dies).  Each process writes OUT/rank<final rank>.json.
"""
import hashlib
import json
import os
import signal
import sys
import time

out, steps, kill_step, add_step = sys.argv[1], *map(int, sys.argv[2:5])
cross = sys.argv[5:] == ["cb"]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import byteps.torch as bps  # noqa: E402
from elastic_files import hosts, mark  # noqa: E402

GLOBAL_BATCH = 128
torch.set_num_threads(1)
d = load_digits()
x_tr, x_te, y_tr, y_te = train_test_split((d.data / 16).astype(np.float32), d.target,
                                          test_size=0.25, random_state=0, stratify=d.target)
x_tr, y_tr, x_te = torch.from_numpy(x_tr), torch.from_numpy(y_tr).long(), torch.from_numpy(x_te)


def started() -> int:
    return len([f for f in os.listdir(out) if f.startswith("started.")])


try:
    import torch._dynamo  # noqa: F401,E402  (bps.init() imports it first: seconds when busy)
except ImportError:
    pass
open(os.path.join(out, f"started.{os.getpid()}"), "w").close()   # imports done
bps.init()
torch.manual_seed(bps.rank())          # differs per rank on purpose: sync() makes them equal
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if cross:
    from byteps.torch.cross_barrier import CrossBarrier
    opt = CrossBarrier(model, sgd, named_parameters=model.named_parameters())
else:
    opt = bps.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
state = bps.elastic.TorchState(model, opt, step=0)
resets = []
state.register_reset_callbacks([lambda: resets.append([state.step, bps.rank(), bps.size()])])


@bps.elastic.run
def train(state):
    while state.step < steps:
        idx = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(state.step))
        mine = idx[:GLOBAL_BATCH].tensor_split(bps.size())[bps.rank()]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_tr[mine]), y_tr[mine], reduction="sum")
        (loss * bps.size() / GLOBAL_BATCH).backward()      # push_pulls start in the hooks
        if state.step == kill_step and bps.rank() == bps.size() - 1 and mark(out, "killed"):
            hosts(out, 3)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        if state.step == add_step and bps.rank() == 0 and mark(out, "added"):
            seen = started()
            hosts(out, 4)
            deadline = time.monotonic() + 60
            while started() == seen:
                if time.monotonic() > deadline:
                    raise SystemExit("no new worker started within 60 s")
                time.sleep(0.05)
            time.sleep(0.5)              # it registers: the scheduler announces it
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


t0 = time.monotonic()
train(state)
with torch.no_grad():
    acc = float((model(x_te).argmax(1).numpy() == y_te).mean())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
    json.dump({"acc": acc, "digest": digest.hexdigest(), "rank": bps.rank(), "size": bps.size(),
               "resets": resets, "seconds": time.monotonic() - t0}, f)
bps.shutdown()

"""Worker for tests/test_mxnet_collectives.py::test_trainers_of_process_sets_in_a_job: 4
ranks (2 hosts x 2), DistributedTrainer(process_set=...) on the members of set [1, 3]
only (root_rank 0 is not one of them), each rank's model randomly initialised with its
own seed; ranks 0 and 2 make no trainer.  Writes OUT_DIR/rank<r>.json: the initial and
final weight sums of a member."""
import json
import sys

import mxnet as mx
import numpy as np

import byteps.mxnet as bps

s = bps.ProcessSet([1, 3])
bps.init(process_sets=[s])
r = bps.rank()
res = {}
if s.included():
    mx.random.seed(r)
    net = mx.gluon.nn.Dense(1, in_units=500)
    net.initialize(mx.init.Normal(1.0))
    tr = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                                process_set=s)
    res["init"] = float(net.weight.data().sum().asscalar())
    x = mx.nd.array(np.random.default_rng(r).standard_normal((8, 500)))
    for _ in range(30):
        with mx.autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
        tr.step(8)
    res["final"] = float(net.weight.data().sum().asscalar())
bps.barrier()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(res, f)
bps.shutdown()

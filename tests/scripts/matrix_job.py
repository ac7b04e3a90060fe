"""One worker of tests/test_feature_matrix.py: trains the digits MLP once per cell of the
feature matrix, in one job, through a plugin's public API.

    python matrix_job.py OUT_DIR PLUGIN CELL [CELL ...]

PLUGIN is numpy, torch, tensorflow (a Keras model, byteps.tensorflow's optimizer) or mxnet;
a CELL is ``algorithm/compression/join`` with algorithm in sync, async, average,
decentralized, diloco (10 inner steps; ``dilocoH``: H inner steps), adasum; compression in none,
onebit (onebit + error feedback), int8; join in off, uneven (rank r stops 6*r steps early
and calls join()).  Each cell has its own
tensor names (a name keeps its settings) and starts from the same seed.

Writes OUT_DIR/rank<r>.json: ``{cell: {"acc", "digest", "steps"} | {"refused": rule} |
{"error": text}}``.  A refusal must come from byteps/core/compat.py (its message names the
rule); any other exception is an error of the cell.  Every rank runs every cell, so a cell
that fails on one rank fails on all (a collective failure is raised everywhere).
"""
from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import re
import sys
import time
import traceback

import numpy as np

from digits_mlp import accuracy, digits, init_params
from digits_mlp import grads as mlp_grads

OUT, PLUGIN, CELLS = sys.argv[1], sys.argv[2], sys.argv[3:]
COMP = {"none": None, "onebit": {"compressor": "onebit", "ef": "vanilla"},
        "int8": {"compressor": "int8"}}
STEPS, BATCH, LR = 600, 32, 0.3    # per rank, whatever the number of ranks
STEPS = int(os.environ.get("MATRIX_STEPS", STEPS))     # fewer: joins inside autotune's search
STUCK_S = float(os.environ.get("MATRIX_CELL_STUCK_S", "150"))


def algorithm(bps, name: str):
    a = bps.algorithms
    name, h = (name[:6], name[6:]) if name.startswith("diloco") else (name, "")
    return {"sync": lambda: a.SyncPS(), "async": lambda: a.AsyncPS(),
            "average": lambda: a.AsyncModelAverage(sync_interval_ms=0),
            "decentralized": lambda: a.Decentralized(peer_selection="shift_one"),
            "diloco": lambda: a.DiLoCo(inner_steps=int(h or 10)),
            "adasum": lambda: a.Adasum()}[name]()


def steps_of(rank: int, nbatches: int, join: str) -> int:
    return STEPS - (6 * rank if join == "uneven" else 0)


def digest(params: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(np.ascontiguousarray(params[k], np.float32).tobytes())
    return h.hexdigest()[:16]


def batches(x, y, rank, size):
    xs, ys = x[rank::size], y[rank::size]
    return [(xs[i:i + BATCH], ys[i:i + BATCH]) for i in range(0, len(xs) - BATCH + 1, BATCH)]


# --- one plugin each: train the cell, return the final numpy parameters ----------------

def run_numpy(cell_id, alg, comp, join):
    import byteps.numpy as bps
    p = {f"{cell_id}.{k}": v for k, v in init_params(0).items()}

    def sgd(params, grads):
        for k in params:
            params[k] -= LR * grads[k]
    opt = bps.DistributedOptimizer(sgd, p, algorithm=algorithm(bps, alg),
                                   compression_params=COMP[comp])
    bs = batches(*DATA[:2], bps.rank(), bps.size())
    n = steps_of(bps.rank(), len(bs), join)
    for s in range(n):
        x, y = bs[s % len(bs)]
        g = mlp_grads({k.split(".", 1)[1]: v for k, v in p.items()}, x, y)
        opt.step({f"{cell_id}.{k}": v for k, v in g.items()})
    if join == "uneven":
        bps.join()
    opt.finish()
    return {k.split(".", 1)[1]: v for k, v in p.items()}, n


def run_torch(cell_id, alg, comp, join):
    import torch
    import byteps.torch as bps
    init = init_params(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    with torch.no_grad():
        model[0].weight.copy_(torch.from_numpy(init["w1"].T.copy()))
        model[0].bias.zero_()
        model[2].weight.copy_(torch.from_numpy(init["w2"].T.copy()))
        model[2].bias.zero_()
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=[(f"{cell_id}.{n}", q)
                                                     for n, q in model.named_parameters()],
                                   compression_params=COMP[comp], algorithm=algorithm(bps, alg))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bs = batches(*DATA[:2], bps.rank(), bps.size())
    n = steps_of(bps.rank(), len(bs), join)
    for s in range(n):
        x, y = bs[s % len(bs)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
    if join == "uneven":
        bps.join()
    opt.finish()
    sd = model.state_dict()
    return {"w1": sd["0.weight"].numpy().T, "b1": sd["0.bias"].numpy(),
            "w2": sd["2.weight"].numpy().T, "b2": sd["2.bias"].numpy()}, n


def run_tensorflow(cell_id, alg, comp, join):
    import tensorflow as tf
    import byteps.tensorflow as bps
    init = init_params(0)
    w1, b1 = tf.Variable(init["w1"], name=f"{cell_id}_w1"), tf.Variable(init["b1"], name=f"{cell_id}_b1")
    w2, b2 = tf.Variable(init["w2"], name=f"{cell_id}_w2"), tf.Variable(init["b2"], name=f"{cell_id}_b2")
    vs = [w1, b1, w2, b2]
    opt = bps.DistributedOptimizer(tf.keras.optimizers.SGD(LR), compression_params=COMP[comp],
                                   algorithm=algorithm(bps, alg))
    bps.broadcast_variables(vs, root_rank=0)
    bs = batches(*DATA[:2], bps.rank(), bps.size())
    n = steps_of(bps.rank(), len(bs), join)
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            z = tf.nn.relu(x @ w1 + b1) @ w2 + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z))
        opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
    for s in range(n):
        x, y = bs[s % len(bs)]
        step(tf.constant(x), tf.constant(y))
    if join == "uneven":
        bps.join()
    opt.finish()
    return {"w1": w1.numpy(), "b1": b1.numpy(), "w2": w2.numpy(), "b2": b2.numpy()}, n


def run_mxnet(cell_id, alg, comp, join):
    import mxnet as mx
    import byteps.mxnet as bps
    init = init_params(0)
    net = mx.gluon.nn.Sequential(prefix=f"{cell_id}_")
    with net.name_scope():
        net.add(mx.gluon.nn.Dense(32, activation="relu", in_units=64),
                mx.gluon.nn.Dense(10, in_units=32))
    net.initialize()
    ps = list(net.collect_params().values())
    for q, v in zip(ps, (init["w1"].T, init["b1"], init["w2"].T, init["b2"])):
        q.set_data(mx.nd.array(v))
    bps.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR},
                                     compression_params=COMP[comp], algorithm=algorithm(bps, alg))
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    bs = batches(*DATA[:2], bps.rank(), bps.size())
    n = steps_of(bps.rank(), len(bs), join)
    for s in range(n):
        x, y = bs[s % len(bs)]
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(len(x))
    if join == "uneven":
        bps.join()
    trainer.finish()
    v = [q.data().asnumpy() for q in ps]
    return {"w1": v[0].T, "b1": v[1], "w2": v[2].T, "b2": v[3]}, n


def main():
    mod = __import__(f"byteps.{PLUGIN}", fromlist=["init"])
    mod.init()
    rank = mod.rank()
    run = globals()[f"run_{PLUGIN}"]
    res = {}
    os.makedirs(OUT, exist_ok=True)
    # a cell takes seconds (0.2-9 s each on a quiet machine): one still running after
    # STUCK_S is stuck, not slow. Every thread's stack then goes to OUT/stack-rank<r>.txt,
    # which tests/matrix.py shows first (all ranks' stacks, not the tail of one), and the
    # rank exits, so the job fails at once instead of at the test's whole-job timeout
    stacks = open(os.path.join(OUT, f"stack-rank{rank}.txt"), "w")
    for i, cell in enumerate(CELLS):
        alg, comp, join = cell.split("/")
        print(f"rank {rank}: cell {cell}", flush=True)
        print(f"cell {cell}", file=stacks, flush=True)
        faulthandler.dump_traceback_later(STUCK_S, file=stacks, exit=True)
        t0 = time.monotonic()
        try:
            params, n = run(f"m{i}", alg, comp, join)
            res[cell] = {"acc": accuracy(params, DATA[2], DATA[3]), "digest": digest(params),
                         "steps": n, "seconds": round(time.monotonic() - t0, 2)}
            print(f"rank {rank}: cell {cell} took {res[cell]['seconds']} s", flush=True)
        except Exception as exc:                       # recorded, the next cell runs
            rule = re.search(r"docs/compatibility\.md, rule '([a-z0-9-]+)'", str(exc))
            res[cell] = ({"refused": rule.group(1), "message": str(exc)} if rule else
                         {"error": "".join(traceback.format_exception(exc))[-3000:]})
            print(f"rank {rank}: cell {cell}: {res[cell].get('refused') or res[cell]['error']}",
                  file=sys.stderr, flush=True)
            mod.barrier()                              # every rank leaves the cell together
    faulthandler.cancel_dump_traceback_later()
    stacks.close()
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    mod.shutdown()


X, Y, XT, YT = digits()             # 1500 / 297: re-split 1200 / 597 for a steadier test score
X, Y = np.concatenate([X, XT]), np.concatenate([Y, YT])
DATA = (X[:1200], Y[:1200], X[1200:], Y[1200:])
main()

"""One byteps worker of benchmarks/compression.py (runs under ``python -m byteps.launcher``).

    compression_worker.py bench '<json args>'   push_pull step time + bytes per compressor
    compression_worker.py train '<json args>'   time to a target accuracy per compressor
    compression_worker.py simulate '<json>'     (no byteps) the training loop with the
                                                compressor pipelines applied in-process,
                                                to pick learning rates and the target

Every configuration runs in the same job, one after another, on its own tensor names
(``<config>.<tensor>``), so float32 and the compressors share the processes, the links
and the machine state.  Prints ``CLUSTER_RESULT {json}`` (one record per worker).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

RESULT_TAG = "CLUSTER_RESULT "


# --------------------------------------------------------------------------- bench mode
def wire_totals(table: dict, prefix: str) -> dict:
    """Sum of the telemetry counters of every tensor whose name starts with ``prefix``."""
    keys = ("pushed", "pushed_wire", "pulled", "pulled_wire")
    tot = dict.fromkeys(keys, 0)
    for name, b in table.items():
        if name.startswith(prefix):
            for k in keys:
                tot[k] += int(b[k])
    return tot


def bench(a: dict) -> None:
    import byteps.numpy as bps
    from byteps.core import api as core

    bps.init()
    rank, size = bps.rank(), bps.size()
    n = int(a["mb"] * 1e6 / 4 / a["tensors"])
    rng = np.random.default_rng(1000 + rank)
    grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(a["tensors"])]
    outs = [np.empty_like(g) for g in grads]
    results = {}
    for cfg, params in a["configs"].items():
        names = [f"{cfg}.g{i}" for i in range(len(grads))]

        def step():
            hs = [core.push_pull_async(g, nm, average=True, out=o, compression_params=params)
                  for g, nm, o in zip(grads, names, outs)]
            for h in hs:
                core.synchronize(h)

        for _ in range(a["warmup"]):
            step()
        bps.barrier()
        before = wire_totals(core.get_pushpull_speed(per_tensor=True)[2], cfg + ".")
        times = []
        for _ in range(a["steps"]):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        bps.barrier()
        after = wire_totals(core.get_pushpull_speed(per_tensor=True)[2], cfg + ".")
        per_step = {k: (after[k] - before[k]) / a["steps"] for k in after}
        ok = all(bool(np.isfinite(o[:1000]).all()) for o in outs)
        results[cfg] = {"times": times, "bytes_per_step": per_step, "finite": ok}
        print(f"rank {rank} {cfg}: median {statistics.median(times):.3f} s/step, "
              f"wire {per_step['pushed_wire'] + per_step['pulled_wire']:.0f} B/step",
              flush=True)
    print(RESULT_TAG + json.dumps({"mode": "bench", "rank": rank, "size": size,
                                   "tensor_bytes": 4 * n, "tensors": len(grads),
                                   "results": results}), flush=True)
    bps.barrier()


# --------------------------------------------------------------------------- training
def dataset(a: dict):
    """A synthetic 10-class problem, the same on every rank: Gaussian classes around
    random prototypes (``sep`` per coordinate) in ``features`` dimensions, unit noise."""
    rng = np.random.default_rng(0)
    protos = rng.standard_normal((10, a["features"])).astype(np.float32) * np.float32(a["sep"])
    n = a["train_n"] + a["test_n"]
    y = rng.integers(0, 10, n)
    x = protos[y] + rng.standard_normal((n, a["features"]), dtype=np.float32)
    return x[:a["train_n"]], y[:a["train_n"]], x[a["train_n"]:], y[a["train_n"]:]


class MLP:
    """features -> hidden (ReLU) -> 10, written in numpy; gradients as float32 arrays."""

    def __init__(self, features: int, hidden: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.params = {
            "w1": (rng.standard_normal((features, hidden)) * np.sqrt(2 / features)).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.standard_normal((hidden, 10)) * np.sqrt(1 / hidden)).astype(np.float32),
            "b2": np.zeros(10, np.float32),
        }

    def grads(self, x, y):
        p = self.params
        h = x @ p["w1"] + p["b1"]
        np.maximum(h, 0, out=h)
        z = h @ p["w2"] + p["b2"]
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        e /= e.sum(axis=1, keepdims=True)
        e[np.arange(len(y)), y] -= 1
        e /= len(y)
        gh = e @ p["w2"].T
        gh *= h > 0
        return {"w1": x.T @ gh, "b1": gh.sum(0), "w2": h.T @ e, "b2": e.sum(0)}

    def accuracy(self, x, y) -> float:
        p = self.params
        h = np.maximum(x @ p["w1"] + p["b1"], 0)
        return float(((h @ p["w2"] + p["b2"]).argmax(1) == y).mean())


def train_config(a: dict, cfg: str, params: dict | None, lr: float, local_mom: float,
                 data, exchange, rank: int, size: int, is_eval_rank: bool, stop_sync):
    """Train one configuration; returns the accuracy curve against training seconds."""
    xtr, ytr, xte, yte = data
    net = MLP(a["features"], a["hidden"], seed=0)
    vel = {k: np.zeros_like(v) for k, v in net.params.items()}
    rng = np.random.default_rng(100 + rank)
    clock, curve, reached = 0.0, [], None
    for step in range(1, a["max_steps"] + 1):
        t0 = time.perf_counter()
        idx = rng.integers(0, len(ytr), a["batch"])
        g = net.grads(xtr[idx], ytr[idx])
        g = exchange(cfg, g, params)
        for k, v in net.params.items():
            if local_mom:
                vel[k] *= local_mom
                vel[k] += g[k]
                v -= lr * vel[k]
            else:
                v -= lr * g[k]
        clock += time.perf_counter() - t0
        if step % a["eval_every"] == 0 or step == a["max_steps"]:
            acc = net.accuracy(xte, yte) if is_eval_rank else 0.0
            stop = stop_sync(cfg, step, acc >= a["target"] if is_eval_rank else False)
            curve.append({"step": step, "seconds": clock, "acc": acc})
            if is_eval_rank and reached is None and acc >= a["target"]:
                reached = {"step": step, "seconds": clock}
            if stop:
                break
    return {"curve": curve, "reached": reached, "steps": step, "seconds": clock,
            "s_per_step": clock / step, "lr": lr, "local_momentum": local_mom,
            "final_acc": curve[-1]["acc"] if curve else None}


def train(a: dict) -> None:
    import byteps.numpy as bps
    from byteps.core import api as core

    bps.init()
    rank, size = bps.rank(), bps.size()
    data = dataset(a)
    flag = np.zeros(1, np.float32)

    def exchange(cfg, g, params):
        hs = {k: core.push_pull_async(np.ascontiguousarray(v, np.float32), f"{cfg}.{k}",
                                      average=True,
                                      compression_params=params) for k, v in g.items()}
        return {k: core.synchronize(h).reshape(g[k].shape) for k, h in hs.items()}

    def stop_sync(cfg, step, mine):
        flag[0] = 1.0 if mine else 0.0
        return float(core.push_pull(flag, f"{cfg}.stop", average=False)[0]) > 0

    out = {}
    for cfg, c in a["configs"].items():
        bps.barrier()
        t0 = time.perf_counter()
        out[cfg] = train_config(a, cfg, c.get("params"), c["lr"], c.get("local_momentum", 0.0),
                                data, exchange, rank, size, rank == 0, stop_sync)
        out[cfg]["wall_s"] = time.perf_counter() - t0
        print(f"rank {rank} {cfg}: reached {out[cfg]['reached']} "
              f"final acc {out[cfg]['final_acc']} {out[cfg]['s_per_step']:.3f} s/step",
              flush=True)
    nparams = sum(v.size for v in MLP(a["features"], a["hidden"]).params.values())
    print(RESULT_TAG + json.dumps({"mode": "train", "rank": rank, "size": size,
                                   "params": int(nparams), "results": out}), flush=True)
    bps.barrier()


def simulate(a: dict) -> None:
    """The training loop without byteps: W simulated workers, pipelines applied in-process
    (worker compress -> server decompress/sum -> server compress -> worker decompress)."""
    from byteps.compression import parse, server_pipeline, worker_pipeline

    data = dataset(a)
    w = a.get("workers", 4)
    pipes = {}

    def exchange(cfg, g, params):
        spec = parse(params)
        out = {}
        for i, (k, v) in enumerate(g.items()):
            flat = np.ascontiguousarray(v, np.float32).ravel()
            if spec is None or flat.nbytes < 65536:
                out[k] = v
                continue
            key = (cfg, k)
            if key not in pipes:
                pipes[key] = ([worker_pipeline(spec, flat.size, i, 0) for _ in range(w)],
                              server_pipeline(spec, flat.size, i, 0), [0])
            wp, sp, rnd = pipes[key]
            rnd[0] += 1
            acc, tmp = np.zeros_like(flat), np.empty_like(flat)
            for j in range(w):   # every simulated worker sends the same gradient + noise
                x = flat + np.float32(0.1) * np.random.default_rng(j * 7 + rnd[0]).standard_normal(
                    flat.size, dtype=np.float32) * np.float32(np.abs(flat).mean())
                wp[j].decompress(wp[j].compress(x, rnd[0]), rnd[0], tmp)
                acc += tmp
            acc /= w
            sp.decompress(sp.compress(acc, rnd[0]), rnd[0], tmp)
            out[k] = tmp.reshape(v.shape).copy()
        return out

    for cfg, c in a["configs"].items():
        r = train_config(a, cfg, c.get("params"), c["lr"], c.get("local_momentum", 0.0), data,
                         exchange, 0, 1, True, lambda cfg, step, mine: mine)
        print(cfg, r["reached"], r["final_acc"], [round(p["acc"], 3) for p in r["curve"]],
              flush=True)


if __name__ == "__main__":
    {"bench": bench, "train": train, "simulate": simulate}[sys.argv[1]](json.loads(sys.argv[2]))

"""Worker script: compressed push_pull against a single-process reference of the
whole two-level pipeline (worker momentum/EF/compress -> server decompress + sum +
compress -> worker decompress), computed here from the other ranks' known inputs.

    compress_pushpull.py OUT_DIR exact|mismatch|bytes [COMPRESSOR]
"""
import json
import sys
import time

import numpy as np

import byteps.numpy as bps
from byteps import compression
from byteps.core import api

out_dir, mode = sys.argv[1], sys.argv[2]
bps.init()
r, n = bps.rank(), bps.size()
res: dict = {"rank": r}

CONFIGS = {
    "fp16": {"compressor": "fp16"},
    "onebit": {"compressor": "onebit", "ef": "vanilla"},
    "onebit_noscale": {"compressor": "onebit", "scaling": False},
    "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": 0.05, "seed": 7, "ef": "vanilla"},
    "dithering": {"compressor": "dithering", "k": 4, "partition": "natural",
                  "normalize": "l2", "seed": 3},
    "int8": {"compressor": "int8"},
    "nesterov": {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "mu": 0.9},
}


def grad(rank: int, step: int, size: int) -> np.ndarray:
    g = np.random.default_rng(1000 * rank + step).standard_normal(size).astype(np.float32)
    return g * (rank + 1)


def reference(params: dict, name: str, size: int, steps: int, average: bool) -> list:
    """What every rank must get, step by step (partitioning as the core does it)."""
    spec = compression.parse(params)
    key = api.tensor_key(name)
    per = api.get_config().partition_bytes // 4
    parts = [(i, s, min(per, size - s)) for i, s in enumerate(range(0, size, per))]
    wp = {(k, i): compression.worker_pipeline(spec, ln, key, i)
          for k in range(n) for i, _, ln in parts}
    sp = {i: compression.server_pipeline(spec, ln, key, i) for i, _, ln in parts}
    out = []
    for step in range(steps):
        res = np.empty(size, np.float32)
        for i, s, ln in parts:
            acc = None
            for k in range(n):
                frame = wp[(k, i)].compress(grad(k, step, size)[s:s + ln].copy(), step)
                d = np.empty(ln, np.float32)
                sp[i].decompress(frame, step, d)
                acc = d if acc is None else acc + d
            frame = sp[i].compress(acc, step)
            d = np.empty(ln, np.float32)
            wp[(r, i)].decompress(frame, step, d)
            res[s:s + ln] = d / n if average else d
        out.append(res)
    return out


if mode == "exact":
    failures, sizes = [], {}
    SIZE, STEPS = 50_001, 3
    for cname, params in CONFIGS.items():
        name = f"grad.{cname}"
        ref = reference(params, name, SIZE, STEPS, average=True)
        for step in range(STEPS):
            y = bps.push_pull(grad(r, step, SIZE), name=name, compression_params=params)
            if y.dtype != np.float32 or not np.array_equal(y, ref[step]):
                bad = np.flatnonzero(y != ref[step])
                failures.append(f"{cname} step {step}: {bad.size} elements differ, first "
                                f"{bad[:3].tolist()}: {y[bad[:3]].tolist()} vs "
                                f"{ref[step][bad[:3]].tolist()}")
    # small tensors travel uncompressed (BYTEPS_MIN_COMPRESS_BYTES): exact sums
    small = bps.push_pull(np.full(100, r + 1, np.float32), name="small", average=False,
                          compression_params=CONFIGS["onebit"])
    if not np.array_equal(small, np.full(100, n * (n + 1) / 2, np.float32)):
        failures.append(f"small tensor: {small[:4]}")
    # integer tensors are never compressed
    ints = bps.push_pull(np.arange(20000, dtype=np.int64) * (r + 1), name="ints",
                         average=False, compression_params=CONFIGS["onebit"])
    if not np.array_equal(ints, np.arange(20000) * n * (n + 1) // 2):
        failures.append("int tensor")
    # float64 is compressed in float32 and comes back as float64
    f64 = bps.push_pull(grad(r, 0, SIZE).astype(np.float64), name="f64",
                        compression_params=CONFIGS["fp16"])
    if f64.dtype != np.float64 or not np.allclose(
            f64, sum(grad(k, 0, SIZE) for k in range(n)) / n, atol=2e-2):
        failures.append(f"float64 fp16: {f64.dtype} {f64[:3]}")
    _, _, table = bps.get_pushpull_speed(per_tensor=True)
    res["bytes"] = {k: v for k, v in table.items() if k.startswith("grad.")}
    res["failures"] = failures
elif mode == "mismatch":
    params = CONFIGS["onebit"] if r == 0 else CONFIGS["topk"]
    t0 = time.monotonic()
    try:
        if r == 1:
            time.sleep(0.5)       # rank 0 declares first
        bps.push_pull(grad(r, 0, 50_000), name="layer.w", compression_params=params)
        res["error"] = None
    except bps.BytePSError as exc:
        res["error"] = str(exc)
    res["seconds"] = time.monotonic() - t0
    try:                           # the same name with other settings on this rank
        bps.push_pull(grad(r, 0, 50_000), name="layer.w", compression_params=CONFIGS["int8"])
        res["local_error"] = None
    except bps.BytePSError as exc:
        res["local_error"] = str(exc)
elif mode == "bytes":
    cname = sys.argv[3]
    params = {"onebit": {"compressor": "onebit", "ef": "vanilla"},
              "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
              "none": None}[cname]
    x = grad(r, 0, 1 << 20)                   # 4 MB of float32
    bps.push_pull(x, name="big", compression_params=params)
    _, _, table = bps.get_pushpull_speed(per_tensor=True)
    res["bytes"] = table["big"]
elif mode == "local":
    # local reduction first (full precision, shared memory), then compression of what
    # leaves the host: every rank identical; fp16 close to the true average
    import hashlib
    digs, failures = {}, []
    for cname in ("fp16", "onebit", "int8", "topk"):
        for step in range(2):
            y = bps.push_pull(grad(r, step, 300_000), name=f"loc.{cname}",
                              compression_params=CONFIGS[cname])
            digs[f"{cname}.{step}"] = hashlib.sha256(y.tobytes()).hexdigest()
            if cname == "fp16":
                true = sum(grad(k, step, 300_000) for k in range(n)) / n
                if not np.allclose(y, true, rtol=2e-3, atol=2e-3):
                    failures.append(f"fp16 step {step}: {np.abs(y - true).max()}")
    _, _, table = bps.get_pushpull_speed(per_tensor=True)
    res["digests"], res["failures"], res["bytes"] = digs, failures, table
elif mode == "hostile":
    # rank 1 sends malformed compressed frames (from inside its engine thread, with its
    # real identity and secret) before each honest push; the servers must drop them
    from byteps.core import engine as _eng
    from byteps.transport.wire import COMP, PULL, PUSH, Op
    real = _eng.Engine.send_tasks
    sent = []

    def evil(self, server, tasks):
        for t in tasks:
            if t.comp is None or (t.handle.tensor.key, server) not in self.declared:
                continue               # (the first push of a tensor carries its declaration)
            if t.wire is None:
                t.wire = self.comp.compress(t)
            tn, w = t.handle.tensor, t.wire
            e = [tn.key, t.part, t.round, PUSH | PULL | COMP, tn.dtype_code, t.length]
            bad = [w[:-1], np.concatenate([w, w[:1]]), np.zeros(0, np.uint8)]
            if tn.name.startswith("topk"):
                k = w.size // 8
                idx = w[:4 * k].view(np.uint32).copy()
                oob = idx.copy()
                oob[-1] = t.length + 5
                dup = idx.copy()
                dup[1] = dup[0]
                bad += [np.concatenate([oob.view(np.uint8), w[4 * k:]]),
                        np.concatenate([dup.view(np.uint8), w[4 * k:]])]
            if tn.name.startswith("dith"):
                lv = w.copy()
                lv[4:] = 127                      # levels beyond k
                bad.append(lv)
            if tn.name.startswith("onebit"):
                nan = w.copy()
                nan[:4] = np.array([np.nan], np.float32).view(np.uint8)
                bad.append(nan)
            for b in bad:
                self.links.send(server, Op.DATA, [[e], []], [b])
            raw = t.src.astype(np.float32) * 1e6   # a raw push for a compressed tensor
            self.links.send(server, Op.DATA, [[[e[0], e[1], e[2], PUSH | PULL,
                                                e[4], e[5]]], []], [raw])
            sent.append(len(bad) + 1)
        return real(self, server, tasks)
    if r == 1:
        _eng.Engine.send_tasks = evil
    failures = []
    for cname in ("topk", "dithering", "onebit"):
        params = CONFIGS[cname]
        name = {"topk": "topk.w", "dithering": "dith.w", "onebit": "onebit.w"}[cname]
        ref = reference(params, name, 50_001, 3, average=True)
        for step in range(3):
            y = bps.push_pull(grad(r, step, 50_001), name=name, compression_params=params)
            if not np.array_equal(y, ref[step]):
                failures.append(f"{cname} step {step}")
    res["failures"], res["malformed_sent"] = failures, sum(sent)
bps.shutdown()
with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(res, f)

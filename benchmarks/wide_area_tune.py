"""The hyper-parameter search behind benchmarks/wide_area.py's defaults (not a test): one
process replays the benchmark's training without servers or network, so that a setting
costs minutes, not a wide-area run.

    .venv/bin/python -m benchmarks.wide_area_tune --algo sync --lr 1.2e-2
    .venv/bin/python -m benchmarks.wide_area_tune --algo diloco --outer-lr 1.0 --outer-momentum 0.4

The same model, text, per-rank batches (rank r's generator seeded 1 + r), validation
set and lr schedule as benchmarks/wide_area_worker.py:

* ``sync``: SyncPS (and DDP) average the W workers' gradients every step, which is one
  model trained on the W batches concatenated;
* ``diloco``: W models, each with its own AdamW; every ``--inner-steps`` (fragment f of
  ``--fragments`` at ``H (f + 1) // F``, then every H) the outer Nesterov step of
  byteps/common/outer.py on the mean outer gradient, as the servers apply it, and every
  model takes the new global parameters.  ``--compressor`` compresses each worker's outer
  gradient with byteps.compression's own worker pipeline (error feedback kept per worker,
  as DiLoCo's ``compression_params`` with ``ef="vanilla"``); ``--overlap-steps D`` models
  ``overlap=True``: the new global parameters of a round arrive D inner steps later and
  are merged as DiLoCo merges them (``local = new_global + (local - local_at_send)``).

Prints one JSON line: the settings, the validation loss every 50 steps and at the end, and
the bytes one worker pushes (outer rounds x frame bytes; SyncPS: every step's float32
gradients) with the ratio ``sync_over`` = SyncPS's bytes / these.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_area_worker import CharLM, add_training_args, batch, lr_factor, text  # noqa: E402

from byteps.core.collective import adasum  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks.wide_area_tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=("sync", "diloco"), default="sync")
    ap.add_argument("--workers", type=int, default=4)
    add_training_args(ap, fragments=1)
    ap.add_argument("--compressor", default=None,
                    help="outer-gradient compressor (int8, onebit, randomk, ...; EF on)")
    ap.add_argument("--k", type=float, default=None, help="the compressor's k")
    ap.add_argument("--overlap-steps", type=int, default=0,
                    help="model overlap=True: merge a round's answer D steps later")
    ap.add_argument("--outer-reduce", choices=("mean", "adasum"), default="mean",
                    help="combine the workers' outer gradients by their mean (DiLoCo) or "
                         "by Horovod's Adasum tree, per parameter tensor")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(1)
    data = np.frombuffer(text(int(a.text_mb * 1e6)), np.uint8)
    cut = int(len(data) * 0.95)
    train, val = data[:cut], data[cut:]
    vx, vy = batch(val, np.random.default_rng(12345), a.val_seqs, a.ctx)
    lossf = nn.CrossEntropyLoss()

    def val_loss(m) -> float:
        with torch.no_grad():
            return float(lossf(m(vx).reshape(-1, 256), vy.reshape(-1)))

    def replica():
        torch.manual_seed(0)
        m = CharLM(a.dim, a.layers, a.ctx)
        o = torch.optim.AdamW(m.parameters(), lr=a.lr)
        return m, o, torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_factor(s, a))

    def step(m, o, sc, x, y) -> None:
        o.zero_grad()
        lossf(m(x).reshape(-1, 256), y.reshape(-1)).backward()
        o.step()
        sc.step()

    rngs = [np.random.default_rng(1 + r) for r in range(a.workers)]
    t0, curve = time.monotonic(), []
    if a.algo == "sync":
        m, o, sc = replica()
        for s in range(a.steps):
            bs = [batch(train, g, a.batch, a.ctx) for g in rngs]
            step(m, o, sc, torch.cat([b[0] for b in bs]), torch.cat([b[1] for b in bs]))
            if (s + 1) % 50 == 0:
                curve.append([s + 1, round(val_loss(m), 4)])
    else:
        reps = [replica() for _ in range(a.workers)]
        m = reps[0][0]
        names = [n for n, _ in m.named_parameters()]
        glob = {n: p.detach().clone() for n, p in m.named_parameters()}
        mom = {n: torch.zeros_like(p) for n, p in glob.items()}
        frag = fragments({n: glob[n].numel() for n in names}, a.fragments)
        H, F = a.inner_steps, a.fragments

        def due(s: int) -> list:
            return [f for f in range(F) if s >= H * (f + 1) // F
                    and (s - H * (f + 1) // F) % H == 0]

        pipes = outer_pipelines(a, {n: glob[n].numel() for n in names})
        pending: list = []          # (merge step, fragment, new global, snapshots)
        sent = [0]                  # bytes rank 0 pushed

        def outer_grad(r: int, n: str, d: torch.Tensor, rnd: int) -> torch.Tensor:
            if pipes is None:
                sent[0] += 4 * d.numel() if r == 0 else 0
                return d
            x = d.numpy().astype(np.float32).ravel()
            frame = pipes[r][n].compress(x, rnd)
            out = np.empty_like(x)
            pipes[r][n].decompress(frame, rnd, out)
            sent[0] += len(frame) if r == 0 else 0
            return torch.from_numpy(out).view_as(d)

        def sync(f: int, s: int) -> None:
            ps = [dict(r[0].named_parameters()) for r in reps]
            rnd = rounds[f]
            rounds[f] += 1
            with torch.no_grad():
                fn = [n for n in names if frag[n] == f]
                snaps = [{n: p[n].detach().clone() for n in fn} for p in ps]
                for n in fn:
                    gs = [outer_grad(r, n, glob[n] - p[n], rnd) for r, p in enumerate(ps)]
                    if a.outer_reduce == "adasum":
                        g = torch.from_numpy(adasum.tree([x.numpy() for x in gs]))
                    else:
                        g = sum(gs) / a.workers
                    mom[n].mul_(a.outer_momentum).add_(g)
                    glob[n] -= a.outer_lr * (g + a.outer_momentum * mom[n])
                new = {n: glob[n].clone() for n in fn}
                if a.overlap_steps and s < a.steps:
                    pending.append((s + a.overlap_steps, f, new, snaps))
                    return
                for p in ps:
                    for n in fn:
                        p[n].copy_(new[n])

        def merge(upto: int, f: int | None = None) -> None:
            """The answers due by step ``upto`` (all of fragment f's: it syncs next)."""
            ps = [dict(r[0].named_parameters()) for r in reps]
            for item in [x for x in pending if x[0] <= upto or x[1] == f]:
                pending.remove(item)
                with torch.no_grad():
                    for p, snap in zip(ps, item[3]):
                        for n, v in item[2].items():
                            p[n].add_(v - snap[n])
        rounds = [0] * F
        for s in range(a.steps):
            for r, (mr, o, sc) in enumerate(reps):
                step(mr, o, sc, *batch(train, rngs[r], a.batch, a.ctx))
            merge(s + 1)
            for f in due(s + 1):
                merge(s + 1, f)
                sync(f, s + 1)
            if (s + 1) % 50 == 0:
                curve.append([s + 1, round(val_loss(m), 4)])
        merge(a.steps + a.overlap_steps)
        for f in range(F):         # finish(): the fragments with steps since their sync
            if f not in due(a.steps):
                sync(f, a.steps)
    sync_bytes = 4 * sum(p.numel() for p in m.parameters()) * a.steps
    pushed = sync_bytes if a.algo == "sync" else sent[0]
    print(json.dumps({"args": vars(a), "final": val_loss(m), "curve": curve,
                      "pushed": pushed, "sync_over": round(sync_bytes / pushed, 1),
                      "seconds": round(time.monotonic() - t0, 1)}), flush=True)
    return 0


def outer_pipelines(a, sizes: dict) -> list | None:
    """Per worker, per parameter: the worker-side compression pipeline DiLoCo's
    ``compression_params={"compressor": C, "ef": "vanilla"}`` runs (None: float32)."""
    if not a.compressor:
        return None
    from byteps import compression
    spec = compression.parse({"compressor": a.compressor, "ef": "vanilla", "k": a.k})
    return [{n: compression.worker_pipeline(spec, size, key, 0)
             for key, (n, size) in enumerate(sizes.items())} for _ in range(a.workers)]


def fragments(sizes: dict, F: int) -> dict:
    """Parameter name -> fragment, as byteps.core.algorithms.diloco._fragments cuts them."""
    load, out = [0] * F, {}
    for n in sorted(sizes, key=lambda n: -sizes[n]):
        g = min(range(F), key=lambda j: (load[j], j))
        out[n] = g
        load[g] += sizes[n]
    return out


if __name__ == "__main__":
    sys.exit(main())

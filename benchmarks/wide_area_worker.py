"""One worker of benchmarks/wide_area.py: a small character-level transformer language model
(PyTorch, CPU) on the Python standard library's own source, trained by one method.

    python -m byteps.launcher python benchmarks/wide_area_worker.py --algo ALGO [--steps 600]
    # ALGO: sync | sync_onebit | diloco | diloco_int8 | streaming  (byteps, through the servers)
    python benchmarks/wide_area_worker.py --algo ddp ...    # torch.distributed gloo allreduce

Every worker trains ``--steps`` steps of ``--batch`` x ``--ctx`` characters (the same
tokens for every method), each rank its own random windows of the training text (the
files of the running interpreter's ``Lib/``, sorted; the last 5 % is validation).  The
inner (or only) optimizer is AdamW.  Rank 0 measures the validation loss of its model every
``--eval-every`` steps (excluded from the timing).  Prints ``CLUSTER_RESULT {json}``: the
curve [[seconds, val loss], ...], the final validation loss after ``finish()``, the bytes
this worker sent and received (byteps: every push and pull on the wire, compressed or not;
DDP: a ring allreduce's 2 (n - 1) / n of the gradients per step, each way) and its peak
send rate: the most bytes sent between two step ends at least 0.5 s apart, per second.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn


def text(max_bytes: int) -> bytes:
    lib = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for p in sorted(lib.glob("*.py")):
        b = p.read_bytes()
        out.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    return b"".join(out)[:max_bytes]


class CharLM(nn.Module):
    def __init__(self, d: int, layers: int, ctx: int):
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, x):
        h = self.emb(x) + self.pos[: x.shape[1]]
        return self.head(self.body(h, mask=self.mask[: x.shape[1], : x.shape[1]],
                                   is_causal=True))


def batch(data: np.ndarray, rng, n: int, ctx: int):
    idx = rng.integers(0, len(data) - ctx - 1, n)
    x = np.stack([data[i:i + ctx] for i in idx]).astype(np.int64)
    y = np.stack([data[i + 1:i + ctx + 1] for i in idx]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def lr_factor(step: int, a) -> float:
    """The inner (or only) optimizer's lr schedule, the same for every method: a linear
    warm-up over ``--warmup`` steps, then a cosine from 1 to ``--min-lr`` at the last step."""
    warm = min(1.0, (step + 1) / a.warmup) if a.warmup else 1.0
    cos = 0.5 * (1 + math.cos(math.pi * min(step, a.steps) / a.steps))
    return warm * (a.min_lr + (1 - a.min_lr) * cos)


def add_training_args(ap: argparse.ArgumentParser, fragments: int) -> None:
    """The model, data and optimizer options shared with benchmarks/wide_area_tune.py."""
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1.2e-2)
    ap.add_argument("--inner-steps", type=int, default=30)
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.4)
    ap.add_argument("--fragments", type=int, default=fragments)
    ap.add_argument("--text-mb", type=float, default=4.0)
    ap.add_argument("--warmup", type=int, default=50, help="linear lr warm-up steps")
    ap.add_argument("--min-lr", type=float, default=0.1,
                    help="cosine decay of the lr to this fraction at the end (1: constant)")
    ap.add_argument("--val-seqs", type=int, default=256, help="validation sequences")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", required=True)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--overlap", type=int, default=1,
                    help="streaming: DiLoCo(overlap=k), merged at most k steps after the "
                         "push (0: overlap=True, whenever it arrives)")
    add_training_args(ap, fragments=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = np.frombuffer(text(int(a.text_mb * 1e6)), np.uint8)
    cut = int(len(data) * 0.95)
    train, val = data[:cut], data[cut:]
    torch.manual_seed(0)
    model = CharLM(a.dim, a.layers, a.ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    bps = dist = None
    if a.algo == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    else:
        import byteps.torch as bps
        bps.init()
        rank, size = bps.rank(), bps.size()
        A = bps.algorithms
        int8 = {"compressor": "int8", "ef": "vanilla"}
        outer = {"inner_steps": a.inner_steps, "outer_lr": a.outer_lr,
                 "outer_momentum": a.outer_momentum}
        alg, comp = {
            "sync": (A.SyncPS(), None),
            "sync_onebit": (A.SyncPS(), {"compressor": "onebit", "ef": "vanilla"}),
            "diloco": (A.DiLoCo(**outer), None),
            "diloco_int8": (A.DiLoCo(**outer, compression_params=int8), None),
            "diloco_int8_long": (A.DiLoCo(**outer, compression_params=int8), None),
            "streaming": (A.DiLoCo(**outer, compression_params=int8, fragments=a.fragments,
                                   overlap=a.overlap or True), None),
        }[a.algo]
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       algorithm=alg, compression_params=comp)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, a))
    nparams = sum(p.numel() for p in model.parameters())
    rng = np.random.default_rng(1 + rank)
    vrng = np.random.default_rng(12345)
    vx, vy = batch(val, vrng, a.val_seqs, a.ctx)
    lossf = nn.CrossEntropyLoss()

    def val_loss() -> float:
        with torch.no_grad():
            return float(lossf(model(vx).reshape(-1, 256), vy.reshape(-1)))

    def counts() -> dict:
        """byteps: tensor -> [pushed raw, pushed wire, pulled raw, pulled wire] so far."""
        from byteps.core import state
        st = state.current()
        return {k: list(v) for k, v in st.engine.comp.bytes.items()} if st.engine else {}

    def sent(col: int = 1) -> int:
        """Bytes this worker sent (col 1) or received (col 3) on the wire so far."""
        if dist is not None:
            return int(2 * (size - 1) / size * nparams * 4 * steps_done)
        return int(sum(b[col] for b in counts().values()))

    def largest_exchange() -> tuple[int, int]:
        """Bytes (sent, received) of this worker's largest single exchange: one step's
        allreduce or push_pull (DDP, SyncPS), one outer round of the largest fragment
        (DiLoCo: the whole model; Streaming DiLoCo: 1/F of it)."""
        if dist is not None:
            return (int(2 * (size - 1) / size * nparams * 4),) * 2
        now = counts()
        d = {k: [v[i] - base_keys.get(k, [0] * 4)[i] for i in range(4)]
             for k, v in now.items()}
        if not isinstance(alg, A.DiLoCo):        # every step one exchange of every tensor
            return (sum(v[1] for v in d.values()) // steps_done,
                    sum(v[3] for v in d.values()) // steps_done)
        best = (0, 0)
        for f, names in enumerate(alg.frags):
            n = sum(1 for e in alg.log if e[0] == "sync" and e[1] == f)
            keys = [alg.prefix + x for x in names]
            out = sum(d.get(k, [0] * 4)[1] for k in keys) // max(n, 1)
            back = sum(d.get(k, [0] * 4)[3] for k in keys) // max(n, 1)
            best = max(best, (out, back))
        return best

    curve, eval_s = [], 0.0
    steps_done = 0
    base, base_in = sent(), sent(3)   # the initial broadcast and seed: not training
    base_keys = counts() if dist is None else {}
    t0 = time.monotonic()
    for s in range(a.steps):
        x, y = batch(train, rng, a.batch, a.ctx)
        opt.zero_grad()
        loss = lossf(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        if dist is not None:      # one bucket, as DDP's (25 MB) holds this whole model
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat.div_(size)
            for g, v in zip(grads, torch.split(flat, [g.numel() for g in grads])):
                g.copy_(v.view_as(g))
        opt.step()
        sched.step()
        steps_done += 1
        if rank == 0 and (s + 1) % a.eval_every == 0:
            e0 = time.monotonic()
            curve.append([e0 - t0 - eval_s, val_loss()])
            eval_s += time.monotonic() - e0
    if bps is not None:
        opt.finish()
    train_s = time.monotonic() - t0 - eval_s
    final = val_loss()
    ex_sent, ex_recv = largest_exchange()
    delays = []           # overlap: inner steps between a round's push and its merge
    if bps is not None and isinstance(alg, A.DiLoCo) and alg.overlap:
        sent_at = {}
        for ev, f, at in alg.log:
            if ev == "sync":
                sent_at[f] = at
            elif ev == "merge" and f in sent_at and at < a.steps:   # not finish()'s
                delays.append(at - sent_at.pop(f))
    print("CLUSTER_RESULT " + json.dumps({
        "algo": a.algo, "rank": rank, "size": size, "steps": a.steps, "params": nparams,
        "tokens": a.steps * a.batch * a.ctx, "train_s": train_s, "curve": curve,
        "final_loss": final, "sent_bytes": sent() - base, "received_bytes": sent(3) - base_in,
        "exchange_sent": ex_sent, "exchange_received": ex_recv,
        "merge_delay_steps": sum(delays) / len(delays) if delays else None,
        "pid": os.getpid()}), flush=True)
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

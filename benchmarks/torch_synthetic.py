"""Synthetic PyTorch benchmark: byteps.torch vs DDP over gloo vs no communication.

In the spirit of BytePS's ``example/pytorch/benchmark_byteps.py``: synthetic
images, a model chosen by name, warm-up iterations, then img/sec per worker
and in total.  One ``bpslaunch --standalone`` job (W workers, S servers)
measures, in the same worker processes, three copies of the model:

* ``nocomm``  plain training, no communication (the physical limit of this
               machine for W concurrent workers),
* ``byteps``  ``bps.DistributedOptimizer`` (hooks overlap backward),
* ``ddp``     ``torch.nn.parallel.DistributedDataParallel`` over gloo on
               loopback (``torch.distributed`` in the same processes),

in ``--rounds`` interleaved rounds of ``--num-iters`` steps each, so that all
three see the same machine load (a shared machine drifts a lot).  A round's
rate comes from its median step time; the table shows the median over rounds
and the ratios byteps/ddp and byteps/no-comm (median of the per-round ratios),
plus the median time of backward and of the wait for communication after it.

``--overlap`` instead compares, for a deep MLP, the overlapping hooks against
one synchronous push_pull of every gradient after backward (same rounds).

    python benchmarks/torch_synthetic.py --model vgg
    python benchmarks/torch_synthetic.py --overlap
Results go to results/torch_synthetic-<model>[-overlap].json (or --json PATH).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "vgg", "deep_mlp")
LABELS = {"nocomm": "no communication (limit)", "byteps": "byteps.torch (hooks)",
          "ddp": "torch DDP (gloo)", "sync": "byteps, push_pull after backward"}


# ------------------------------------------------------------------ models
def build_model(name: str):
    from torch import nn
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    if name == "vgg":      # a small VGG-like convnet for 32x32 images
        def block(cin, cout, n):
            layers = []
            for i in range(n):
                layers += [nn.Conv2d(cin if i == 0 else cout, cout, 3, padding=1), nn.ReLU()]
            return [*layers, nn.MaxPool2d(2)]
        return nn.Sequential(*block(3, 32, 2), *block(32, 64, 2), *block(64, 128, 2),
                             nn.Flatten(), nn.Linear(128 * 4 * 4, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if name == "deep_mlp":
        layers = [nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU()]
        for _ in range(10):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 10))
    raise SystemExit(f"unknown --model {name!r}; choose one of {', '.join(MODELS)}")


# ------------------------------------------------------------------ worker side
def _systems(args, bps, torch):
    """name -> (model, optimizer, extra step after backward or None)."""
    def fresh():
        torch.manual_seed(0)
        m = build_model(args.model)
        return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    out = {}
    if args.overlap:
        m, opt = fresh()
        out["byteps"] = (m, bps.DistributedOptimizer(opt, named_parameters=m.named_parameters()),
                         None)
        m, opt = fresh()
        named = list(m.named_parameters())

        def sync_all(named=named):
            hs = [bps.push_pull_async_inplace(p.grad, name="Sync.Gradient." + n, priority=-i)
                  for i, (n, p) in enumerate(named)]
            for h in hs:
                bps.synchronize(h)
        out["sync"] = (m, opt, sync_all)
        return out
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=bps.rank(), world_size=bps.size())
    out["nocomm"] = (*fresh(), None)
    m, opt = fresh()
    out["byteps"] = (m, bps.DistributedOptimizer(opt, named_parameters=m.named_parameters()),
                     None)
    m, _ = fresh()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    out["ddp"] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9), None)
    return out


def run_worker(args) -> None:
    import torch
    import torch.nn.functional as F

    import byteps.torch as bps
    from byteps.torch.optimizer import _DistributedOptimizer as _DistOpt
    torch.set_num_threads(1)
    bps.init()
    systems = _systems(args, bps, torch)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    phases: dict[str, list] = {"backward": [], "wait": []}

    def step(model, opt, extra):
        """One training step; records backward time and the wait for communication after it."""
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        if extra is not None:
            extra()
        elif isinstance(opt, _DistOpt):
            opt.synchronize()
        t2 = time.perf_counter()
        phases["backward"].append(t1 - t0)
        phases["wait"].append(t2 - t1)
        if isinstance(opt, _DistOpt):
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()

    for sysargs in systems.values():
        for _ in range(args.num_warmup):
            step(*sysargs)
    medians: dict[str, list] = {name: [] for name in systems}
    breakdown: dict[str, dict] = {name: {"backward": [], "wait": []} for name in systems}
    for _ in range(args.rounds):
        for name, sysargs in systems.items():
            bps.push_pull(torch.zeros(1), name="bench.barrier")   # start together
            times = []
            for v in phases.values():
                v.clear()
            for _ in range(args.num_iters):
                t0 = time.perf_counter()
                step(*sysargs)
                times.append(time.perf_counter() - t0)
            medians[name].append(statistics.median(times))
            for k, v in phases.items():
                breakdown[name][k].append(statistics.median(v))
    from byteps.core import api as _api
    tu = _api._STATE.tuner
    Path(f"{args.result_file}.{bps.rank()}").write_text(json.dumps(
        {"rank": bps.rank(), "size": bps.size(), "median_step_s": medians,
         "median_phase_s": breakdown,
         "autotune": None if tu is None else {"state": tu.state, "choice": tu.choice,
                                              "hold": tu.hold}}))
    bps.push_pull(torch.zeros(1), name="bench.barrier")
    if "ddp" in systems:
        torch.distributed.destroy_process_group()
    bps.shutdown()


# ------------------------------------------------------------------ driver side
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(args, result: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(kv.split("=", 1) for kv in args.env)
    if args.num_workers == 1:                # still go through the servers
        env["BYTEPS_FORCE_DISTRIBUTED"] = "1"
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--num-workers",
           str(args.num_workers), "--hosts", str(args.num_workers), "--num-servers",
           str(args.num_servers), sys.executable, str(Path(__file__).resolve()), "--worker",
           "--model", args.model,
           "--batch-size", str(args.batch_size), "--num-iters", str(args.num_iters),
           "--num-warmup", str(args.num_warmup), "--rounds", str(args.rounds),
           "--port", str(_free_port()), "--result-file", result,
           *(["--overlap"] if args.overlap else [])]
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"benchmark job timed out after {args.timeout:g} s") from None
    if p.returncode != 0:
        raise SystemExit(f"benchmark job failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-3000:]}")
    rows = []
    for r in range(args.num_workers):
        f = Path(f"{result}.{r}")
        if not f.exists():
            raise SystemExit(f"worker rank {r} wrote no result ({f})")
        rows.append(json.loads(f.read_text()))
    return rows


def summarize(rows: list[dict], batch: int) -> dict:
    """Per system: per-round totals, then medians over rounds; per-round ratios."""
    names = list(rows[0]["median_step_s"])
    rounds = len(rows[0]["median_step_s"][names[0]])
    total = {n: [sum(batch / r["median_step_s"][n][k] for r in rows) for k in range(rounds)]
             for n in names}
    out = {"systems": {}}
    for n in names:
        med = statistics.median(total[n])
        out["systems"][n] = {"img_per_sec_total": med, "img_per_sec_per_worker": med / len(rows),
                             "ms_per_step": 1e3 * statistics.median(
                                 statistics.median(r["median_step_s"][n][k] for r in rows)
                                 for k in range(rounds)),
                             "img_per_sec_total_per_round": total[n],
                             "ms_backward": 1e3 * statistics.median(
                                 x for r in rows for x in r["median_phase_s"][n]["backward"]),
                             "ms_wait_after_backward": 1e3 * statistics.median(
                                 x for r in rows for x in r["median_phase_s"][n]["wait"])}
    for other in [n for n in names if n != "byteps"]:
        ratios = [total["byteps"][k] / total[other][k] for k in range(rounds)]
        out[f"ratio_byteps_vs_{other}"] = statistics.median(ratios)
        out[f"ratio_byteps_vs_{other}_per_round"] = ratios
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="byteps.torch synthetic benchmark")
    ap.add_argument("--model", default=None, help=f"one of {', '.join(MODELS)} (default vgg; "
                                                  f"deep_mlp with --overlap)")
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--num-iters", type=int, default=10, help="timed steps per round")
    ap.add_argument("--num-warmup", type=int, default=20,
                    help="untimed steps per system first (autotune decides within 19)")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for the job (e.g. BYTEPS_AUTOTUNE=0)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per system")
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--num-servers", type=int, default=2)
    ap.add_argument("--overlap", action="store_true",
                    help="deep MLP: overlapping hooks vs one push_pull after backward")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or ("deep_mlp" if args.overlap else "vgg")
    if args.model not in MODELS:
        raise SystemExit(f"unknown --model {args.model!r}; choose one of {', '.join(MODELS)}")
    if args.worker:
        return run_worker(args)
    import torch
    nparams = sum(p.numel() for p in build_model(args.model).parameters())
    print(f"model {args.model} ({nparams / 1e6:.2f} M parameters, {nparams * 4 / 2**20:.1f} MiB "
          f"of gradients), batch {args.batch_size}/worker, {args.num_workers} workers, "
          f"{args.num_servers} servers, {args.rounds} rounds x {args.num_iters} iters after "
          f"{args.num_warmup} warm-up, torch {torch.__version__}, {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = _run_job(args, os.path.join(tmp, "res"))
    out = {"model": args.model, "params": nparams, "batch_size": args.batch_size,
           "num_workers": args.num_workers, "num_servers": args.num_servers,
           "rounds": args.rounds, "num_iters": args.num_iters, "cpus": os.cpu_count(),
           "torch": torch.__version__, "overlap": args.overlap,
           **summarize(rows, args.batch_size), "workers": rows}
    print(f"{'system':<34}{'img/s/worker':>13}{'img/s total':>12}{'ms/step':>9}"
          f"{'ms bwd':>8}{'ms wait':>9}")
    for n, s in out["systems"].items():
        print(f"{LABELS[n]:<34}{s['img_per_sec_per_worker']:>13.1f}"
              f"{s['img_per_sec_total']:>12.1f}{s['ms_per_step']:>9.1f}"
              f"{s['ms_backward']:>8.1f}{s['ms_wait_after_backward']:>9.1f}")
    print("   ".join(f"ratio byteps/{k[len('ratio_byteps_vs_'):]}: {v:.2f}"
                     for k, v in out.items() if k.startswith("ratio_") and
                     not k.endswith("_per_round")) + "   (median of per-round ratios)")
    at = rows[0].get("autotune")
    if at:
        print(f"autotune (rank 0): {at['state']}, partitions/window {at['choice']}, "
              f"{'held until the wait' if at['hold'] else 'sent as pushed (overlap)'}")
    path = Path(args.json) if args.json else ROOT / "results" / \
        f"torch_synthetic-{args.model}{'-overlap' if args.overlap else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

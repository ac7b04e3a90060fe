"""Synthetic PyTorch benchmark: byteps.torch vs DDP over gloo vs no communication.

In the spirit of BytePS's ``example/pytorch/benchmark_byteps.py``: synthetic
images, a model chosen by name, warm-up iterations, then img/sec per worker
and in total.  One invocation measures, on the same machine and one after the
other:

* ``nocomm``  W independent processes training without any communication
               (the physical limit of this machine for W workers),
* ``byteps``  ``bpslaunch --standalone`` with W workers and S servers,
               ``bps.DistributedOptimizer`` (hooks overlap backward),
* ``ddp``     ``torch.nn.parallel.DistributedDataParallel`` over gloo on
               loopback with W processes,

and prints a table with the ratios byteps/ddp and byteps/nocomm.  Each system
runs ``--repeats`` times, interleaved, and the best run is reported (the
machine may be shared); a run's rate comes from its median step time, and
every run's total is kept in the JSON.

``--overlap`` instead compares, for a deep MLP under byteps, the time per
step of the overlapping hooks against one synchronous push_pull of every
gradient after backward (the closing-note measurement).

    python benchmarks/torch_synthetic.py --model vgg --num-iters 20
    python benchmarks/torch_synthetic.py --overlap
Results go to results/torch_synthetic-<model>.json (or --json PATH).
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
            return layers + [nn.MaxPool2d(2)]
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
def run_worker(args) -> None:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))
    mode = args.worker
    sync_all = barrier = None
    if mode == "byteps":
        import byteps.torch as bps
        bps.init()
        rank, size = bps.rank(), bps.size()
        named = list(model.named_parameters())
        if args.sync_after_backward:
            def sync_all():
                hs = [bps.push_pull_async_inplace(p.grad, name="Gradient." + n, priority=-i)
                      for i, (n, p) in enumerate(named)]
                for h in hs:
                    bps.synchronize(h)
        else:
            opt = bps.DistributedOptimizer(opt, named_parameters=named)
        bps.broadcast_parameters(model.state_dict(), root_rank=0)

        def barrier():
            bps.push_pull(torch.zeros(1), name="bench.barrier")
    elif mode == "ddp":
        import torch.distributed as dist
        rank, size = args.rank, args.world
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=size)
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        barrier = dist.barrier
    else:
        rank, size = args.rank, args.world

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        if sync_all is not None:
            sync_all()
        opt.step()

    for _ in range(args.num_warmup):
        step()
    if barrier:
        barrier()
    times = []
    for _ in range(args.num_iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if barrier:
        barrier()
    med = statistics.median(times)         # robust against a shared machine's hiccups
    res = {"rank": rank, "size": size, "img_per_sec": args.batch_size / med, "step_s": med,
           "step_s_mean": sum(times) / len(times), "step_times": times}
    Path(f"{args.result_file}.{rank}").write_text(json.dumps(res))
    if mode == "byteps":
        bps.shutdown()
    elif mode == "ddp":
        dist.destroy_process_group()


# ------------------------------------------------------------------ driver side
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _worker_argv(args, mode: str, result: str, extra=()) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--model",
            args.model, "--batch-size", str(args.batch_size), "--num-iters",
            str(args.num_iters), "--num-warmup", str(args.num_warmup), "--result-file",
            result, *extra]


def _collect(result: str, workers: int, what: str) -> list[dict]:
    out = []
    for r in range(workers):
        p = Path(f"{result}.{r}")
        if not p.exists():
            raise SystemExit(f"{what}: worker rank {r} wrote no result ({p})")
        out.append(json.loads(p.read_text()))
    return out


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        p = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what}: timed out after {timeout:g} s") from None
    if p.returncode != 0:
        raise SystemExit(f"{what} failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-3000:]}")


def run_byteps(args, tmp: str, tag: str, extra=()) -> list[dict]:
    result = os.path.join(tmp, tag)
    _run([sys.executable, "-m", "byteps.launcher", "--standalone", "--num-workers",
          str(args.num_workers), "--num-servers", str(args.num_servers),
          *_worker_argv(args, "byteps", result, extra)], tag, args.timeout)
    return _collect(result, args.num_workers, tag)


def run_group(args, tmp: str, mode: str) -> list[dict]:
    """W plain processes: DDP over gloo, or no communication at all."""
    result = os.path.join(tmp, mode)
    port = _free_port()
    procs = [subprocess.Popen(_worker_argv(args, mode, result, ["--rank", str(r), "--world",
                                                                str(args.num_workers),
                                                                "--port", str(port)]),
                              env=_env(), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(args.num_workers)]
    deadline = time.monotonic() + args.timeout
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{mode}: timed out after {args.timeout:g} s") from None
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"{mode} worker {r} failed (rc={p.returncode}):\n{out[-3000:]}")
    return _collect(result, args.num_workers, mode)


def _summary(rows: list[dict]) -> dict:
    rates = [r["img_per_sec"] for r in rows]
    return {"img_per_sec_per_worker": sum(rates) / len(rates), "img_per_sec_total": sum(rates),
            "step_s": sum(r["step_s"] for r in rows) / len(rows), "workers": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description="byteps.torch synthetic benchmark")
    ap.add_argument("--model", default="vgg", help=f"one of {', '.join(MODELS)}")
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--num-iters", type=int, default=20)
    ap.add_argument("--num-warmup", type=int, default=3)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--num-servers", type=int, default=2)
    ap.add_argument("--overlap", action="store_true",
                    help="deep MLP: overlapping hooks vs one push_pull after backward")
    ap.add_argument("--repeats", type=int, default=2,
                    help="run every system this many times, interleaved; report the best")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", default=None)
    # worker-side arguments (internal)
    ap.add_argument("--worker", choices=("byteps", "ddp", "nocomm"), help=argparse.SUPPRESS)
    ap.add_argument("--sync-after-backward", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    if args.model not in MODELS:
        raise SystemExit(f"unknown --model {args.model!r}; choose one of {', '.join(MODELS)}")
    if args.overlap and args.model == "vgg" and "--model" not in sys.argv:
        args.model = "deep_mlp"
    import torch
    nparams = sum(p.numel() for p in build_model(args.model).parameters())
    head = (f"model {args.model} ({nparams / 1e6:.2f} M parameters, "
            f"{nparams * 4 / 2**20:.1f} MiB of gradients), batch {args.batch_size}/worker, "
            f"{args.num_workers} workers, {args.num_servers} servers, {args.num_iters} iters "
            f"after {args.num_warmup} warm-up, best of {args.repeats}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs")
    print(head, flush=True)
    out = {"model": args.model, "params": nparams, "batch_size": args.batch_size,
           "num_workers": args.num_workers, "num_servers": args.num_servers,
           "num_iters": args.num_iters, "cpus": os.cpu_count(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        if args.overlap:
            overs, syncs = [], []
            for i in range(args.repeats):      # interleaved: a loaded machine drifts
                overs.append(_summary(run_byteps(args, tmp, f"overlap{i}")))
                syncs.append(_summary(run_byteps(args, tmp, f"sync{i}",
                                                 ["--sync-after-backward"])))
            over = min(overs, key=lambda s: s["step_s"])
            sync = min(syncs, key=lambda s: s["step_s"])
            out["all_runs_step_s"] = {"overlap": [s["step_s"] for s in overs],
                                      "sync_after_backward": [s["step_s"] for s in syncs]}
            out.update(overlap=over, sync_after_backward=sync,
                       speedup=sync["step_s"] / over["step_s"])
            print(f"{'variant':<34}{'ms/step':>10}{'img/s/worker':>14}")
            for name, s in (("byteps hooks (overlap backward)", over),
                            ("byteps one push_pull after bwd", sync)):
                print(f"{name:<34}{s['step_s'] * 1e3:>10.1f}"
                      f"{s['img_per_sec_per_worker']:>14.1f}")
            print(f"overlap speed-up: {out['speedup']:.2f}x")
        else:
            runs: dict[str, list] = {"nocomm": [], "byteps": [], "ddp": []}
            for i in range(args.repeats):      # interleaved: a loaded machine drifts
                runs["nocomm"].append(_summary(run_group(args, tmp, "nocomm")))
                runs["byteps"].append(_summary(run_byteps(args, tmp, f"byteps{i}")))
                runs["ddp"].append(_summary(run_group(args, tmp, "ddp")))
            res = {k: max(v, key=lambda s: s["img_per_sec_total"]) for k, v in runs.items()}
            out.update(res)
            out["all_runs_img_per_sec_total"] = {k: [s["img_per_sec_total"] for s in v]
                                                 for k, v in runs.items()}
            out["ratio_byteps_vs_ddp"] = (res["byteps"]["img_per_sec_total"]
                                          / res["ddp"]["img_per_sec_total"])
            out["ratio_byteps_vs_nocomm"] = (res["byteps"]["img_per_sec_total"]
                                             / res["nocomm"]["img_per_sec_total"])
            print(f"{'system':<28}{'img/s/worker':>14}{'img/s total':>13}{'ms/step':>10}")
            for name, label in (("nocomm", "no communication (limit)"),
                                ("byteps", "byteps.torch"), ("ddp", "torch DDP (gloo)")):
                s = res[name]
                print(f"{label:<28}{s['img_per_sec_per_worker']:>14.1f}"
                      f"{s['img_per_sec_total']:>13.1f}{s['step_s'] * 1e3:>10.1f}")
            print(f"ratio byteps/ddp: {out['ratio_byteps_vs_ddp']:.2f}   "
                  f"byteps/no-comm: {out['ratio_byteps_vs_nocomm']:.2f}")
    path = Path(args.json) if args.json else \
        ROOT / "results" / f"torch_synthetic-{args.model}{'-overlap' if args.overlap else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Gradient compression in the emulated cluster (issue 11's benchmark).

    sudo .venv/bin/python benchmarks/compression.py                 # 100mbit,1gbit, 100 MB
    sudo .venv/bin/python benchmarks/compression.py --quick         # small, to debug
    sudo .venv/bin/python benchmarks/compression.py --rates 100mbit --mb 40 --steps 3

Builds 4 worker hosts + 4 server hosts as network namespaces (benchmarks/cluster/netns.py),
shapes every host link with tc tbf (both directions) and, per rate:

1. probes raw TCP on the 4 worker->server links at once (the measured link rate B);
2. runs ONE byteps job (scheduler + 4 servers + 4 numpy workers) in which every
   configuration -- float32, fp16, onebit+ef, topk(1%)+ef, randomk(1%)+ef, dithering(k=4),
   int8 -- push_pulls the same ``--mb`` MB of gradients (``--tensors`` tensors) ``--steps``
   times, each on its own tensor names: seconds per step (slowest rank's median) and the
   wire bytes per step from ``get_pushpull_speed(per_tensor=True)``;
3. at ``--train-rate``, one more job trains a wide numpy MLP on a synthetic 10-class task
   with float32, fp16, onebit+EF+nesterov, topk+EF and int8 until a target test accuracy:
   training seconds to reach it (evaluation time excluded).

Then the compressor throughput table of benchmarks/compression_throughput.py (same run).
Prints the tables (ratios vs float32 and the link bound M/B, measured in the same run),
writes benchmarks/results/compression.json and compression.png.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cluster import jobs  # noqa: E402
from benchmarks.cluster.netns import Cluster, NetnsError, Plan, rate_bps  # noqa: E402

WORKER = str(ROOT / "benchmarks" / "compression_worker.py")
CONFIGS = {
    "float32": None,
    "fp16": {"compressor": "fp16"},
    "onebit+ef": {"compressor": "onebit", "ef": "vanilla"},
    "topk1%+ef": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
    "randomk1%+ef": {"compressor": "randomk", "k": 0.01, "ef": "vanilla"},
    "dithering4": {"compressor": "dithering", "k": 4},
    "int8": {"compressor": "int8"},
}
# training: lr and local (optimizer-side) momentum; onebit runs the compressor's nesterov
# momentum instead (worker side, as the original recommends) and plain SGD after it
TRAIN_CONFIGS = {
    "float32": {"params": None, "lr": 0.02, "local_momentum": 0.9},
    "fp16": {"params": {"compressor": "fp16"}, "lr": 0.02, "local_momentum": 0.9},
    "onebit+ef+nesterov": {"params": {"compressor": "onebit", "ef": "vanilla",
                                      "momentum": "nesterov", "mu": 0.9}, "lr": 0.02},
    "topk1%+ef": {"params": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}, "lr": 0.02,
                  "local_momentum": 0.9},
    "int8": {"params": {"compressor": "int8"}, "lr": 0.02, "local_momentum": 0.9},
}
TARGET_BYTES, TARGET_SPEED, TARGET_TRAIN = 10.0, 3.0, 0.5   # at the slowest rate


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100mbit,1gbit", help="link rates (tc syntax)")
    ap.add_argument("--mb", type=float, default=100.0, help="MB of gradients per step")
    ap.add_argument("--tensors", type=int, default=25)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--burst-ms", type=float, default=2.0, help="tbf bucket (ms at the rate)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="tbf queue")
    ap.add_argument("--train-rate", default="100mbit")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--hidden", type=int, default=2048, help="MLP width (1024 inputs)")
    ap.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--throughput-n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="debug run: 1gbit,100mbit with 12 MB, 2 steps, small training")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args(argv)
    if a.quick:
        a.mb, a.tensors, a.steps, a.hidden, a.max_steps = 12.0, 3, 2, 512, 30
        a.throughput_n = 1 << 22
    a.rates = [r for r in a.rates.split(",") if r]
    for r in a.rates + [a.train_rate]:
        rate_bps(r)
    return a


def run_job(plan, whosts, shosts, argv, port, timeout) -> list[dict]:
    env = {"BYTEPS_RESEND_TIMEOUT_S": "60"}   # as benchmarks/cluster/run.py: no resends
    specs = jobs.byteps_job(whosts, shosts, shosts[0], argv, port, env)
    return jobs.collect(jobs.run_specs(plan, specs, timeout))


def probe(plan, whosts, shosts, port, seconds=2.0) -> float | None:
    """Mean raw-TCP receive rate (bytes/s) of every worker->server link at once."""
    pairs = [(whosts[i], shosts[i % len(shosts)]) for i in range(len(whosts))]
    recs = jobs.collect(jobs.run_specs(plan, jobs.probe_job(pairs, port, seconds), 60))
    got = [r["recv_Bps"] for r in recs if r.get("recv_Bps")]
    return sum(got) / len(got) if got else None


def bench_rows(rate: str, recs: list[dict], link_Bps: float | None) -> list[dict]:
    rows = []
    cfgs = list(recs[0]["results"])
    for cfg in cfgs:
        per = [r["results"][cfg] for r in recs]
        t = max(statistics.median(p["times"]) for p in per)
        b = {k: statistics.mean(p["bytes_per_step"][k] for p in per)
             for k in per[0]["bytes_per_step"]}
        wire = b["pushed_wire"] + b["pulled_wire"]
        # each worker link carries its pushes up and its pulls down (full duplex)
        bound = max(b["pushed_wire"], b["pulled_wire"]) / link_Bps if link_Bps else None
        rows.append({"rate": rate, "config": cfg, "params": CONFIGS.get(cfg), "s_per_step": t,
                     "raw_bytes_per_step": b["pushed"] + b["pulled"], "wire_bytes_per_step": wire,
                     "bytes": b, "bound_s": bound, "finite": all(p["finite"] for p in per),
                     "per_rank_median_s": [statistics.median(p["times"]) for p in per]})
    base = next(r for r in rows if r["config"] == "float32")
    for r in rows:
        r["bytes_vs_f32"] = base["wire_bytes_per_step"] / r["wire_bytes_per_step"]
        r["speedup_vs_f32"] = base["s_per_step"] / r["s_per_step"]
        r["vs_bound"] = r["bound_s"] / r["s_per_step"] if r["bound_s"] else None
    return rows


def bench_table(rows, probes) -> str:
    out = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        p = probes.get(rate)
        out.append(f"link {rate}: raw TCP, 4 links at once: "
                   f"{p * 8 / 1e6:.1f} Mbit/s each" if p else f"link {rate}: no probe")
        out.append(f"{'config':<14}{'wire MB/step':>13}{'x fewer B':>10}{'s/step':>8}"
                   f"{'speedup':>9}{'M/B s':>8}{'bound/t':>9}")
        for r in rows:
            if r["rate"] != rate:
                continue
            bs = "-" if r["bound_s"] is None else f"{r['bound_s']:.3f}"
            vb = "-" if r["vs_bound"] is None else f"{r['vs_bound']:.2f}"
            out.append(f"{r['config']:<14}{r['wire_bytes_per_step'] / 1e6:>13.2f}"
                       f"{r['bytes_vs_f32']:>10.1f}{r['s_per_step']:>8.3f}"
                       f"{r['speedup_vs_f32']:>9.2f}{bs:>8}{vb:>9}")
        out.append("")
    return "\n".join(out)


def train_rows(rate: str, recs: list[dict]) -> list[dict]:
    r0 = next(r for r in recs if r["rank"] == 0)
    rows = []
    for cfg, res in r0["results"].items():
        slow = max(r["results"][cfg]["s_per_step"] for r in recs)
        rows.append({"rate": rate, "config": cfg, "params": TRAIN_CONFIGS[cfg]["params"],
                     "lr": res["lr"], "local_momentum": res["local_momentum"],
                     "reached_step": (res["reached"] or {}).get("step"),
                     "reached_s": (res["reached"] or {}).get("seconds"),
                     "s_per_step": res["s_per_step"], "slowest_rank_s_per_step": slow,
                     "final_acc": res["final_acc"], "steps": res["steps"],
                     "curve": res["curve"], "model_params": r0["params"]})
    base = next((r for r in rows if r["config"] == "float32"), None)
    for r in rows:
        r["time_vs_f32"] = (r["reached_s"] / base["reached_s"]
                            if base and base["reached_s"] and r["reached_s"] else None)
    return rows


def train_table(rows, target) -> str:
    if not rows:
        return ""
    out = [f"training to {target:.0%} test accuracy at {rows[0]['rate']} "
           f"({rows[0]['model_params'] / 1e6:.2f} M params, "
           f"{rows[0]['model_params'] * 4 / 1e6:.1f} MB of float32 gradients per step)",
           f"{'config':<20}{'steps':>6}{'seconds':>9}{'x f32 time':>11}{'s/step':>8}"
           f"{'final acc':>10}"]
    for r in rows:
        st = "-" if r["reached_step"] is None else str(r["reached_step"])
        sec = "not reached" if r["reached_s"] is None else f"{r['reached_s']:.1f}"
        vs = "-" if r["time_vs_f32"] is None else f"{r['time_vs_f32']:.2f}"
        out.append(f"{r['config']:<20}{st:>6}{sec:>9}{vs:>11}{r['s_per_step']:>8.3f}"
                   f"{r['final_acc']:>10.3f}")
    return "\n".join(out)


def verdicts(rows, trows, slow_rate) -> list[str]:
    out = []
    ob = next((r for r in rows if r["rate"] == slow_rate and r["config"] == "onebit+ef"), None)
    if ob:
        out.append(f"onebit at {slow_rate}: {ob['bytes_vs_f32']:.1f}x fewer bytes (target >= "
                   f"{TARGET_BYTES:g}x: {'met' if ob['bytes_vs_f32'] >= TARGET_BYTES else 'NOT met'})"
                   f", {ob['speedup_vs_f32']:.2f}x faster steps (target >= {TARGET_SPEED:g}x: "
                   f"{'met' if ob['speedup_vs_f32'] >= TARGET_SPEED else 'NOT met'})")
    for r in trows:
        if r["config"] == "float32":
            continue
        ok = r["time_vs_f32"] is not None and r["time_vs_f32"] <= TARGET_TRAIN
        out.append(f"training {r['config']}: time to target "
                   f"{'-' if r['time_vs_f32'] is None else format(r['time_vs_f32'], '.2f')}"
                   f" x float32 (target <= {TARGET_TRAIN:g}: {'met' if ok else 'NOT met'})")
    return out


def plot(rows, trows, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    cfgs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, 3 if trows else 2, figsize=(17 if trows else 12, 4.8))
    w = 0.8 / max(1, len(rates))
    for i, rate in enumerate(rates):
        sel = {r["config"]: r for r in rows if r["rate"] == rate}
        xs = [j + i * w for j in range(len(cfgs))]
        axes[0].bar(xs, [sel[c]["s_per_step"] for c in cfgs], w, label=rate)
        axes[1].bar(xs, [sel[c]["wire_bytes_per_step"] / 1e6 for c in cfgs], w, label=rate)
    for ax, title in ((axes[0], "seconds per step (slowest rank)"),
                      (axes[1], "wire MB per step per worker (push+pull)")):
        ax.set_xticks([j + w * (len(rates) - 1) / 2 for j in range(len(cfgs))], cfgs,
                      rotation=30, ha="right")
        ax.set_title(title)
        ax.set_yscale("log")
        ax.legend()
    if trows:
        ax = axes[2]
        for r in trows:
            ax.plot([p["seconds"] for p in r["curve"]], [p["acc"] for p in r["curve"]],
                    marker=".", label=r["config"])
        ax.axhline(trows[0].get("target", 0.95), color="k", ls=":", lw=1)
        ax.set_xlabel(f"training seconds at {trows[0]['rate']}")
        ax.set_ylabel("test accuracy")
        ax.set_title("time to accuracy")
        ax.legend(fontsize=8)
    fig.suptitle("byteps gradient compression, 4 workers + 4 servers, emulated cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    a = parse_args(argv)
    started = time.time()
    plan = Plan.new(a.workers + a.servers)
    cluster = Cluster(plan)
    atexit.register(cluster.close)
    old = {sig: signal.signal(sig, lambda signum, _f: sys.exit(128 + signum))
           for sig in (signal.SIGTERM, signal.SIGHUP)}
    rows, trows, probes, port = [], [], {}, 23000
    train_args = {"train_n": 10000, "test_n": 1000, "features": 1024, "sep": 0.2,
                  "hidden": a.hidden, "batch": 32, "max_steps": a.max_steps, "eval_every": 5,
                  "target": a.target, "configs": TRAIN_CONFIGS}
    load0 = os.getloadavg()
    try:
        with cluster:
            print(f"cluster {plan.prefix}: {plan.nhosts} hosts, {os.cpu_count()} CPU cores, "
                  f"load average {load0[0]:.1f} (other work on this machine skews the numbers)",
                  flush=True)
            whosts, shosts = plan.hosts[:a.workers], plan.hosts[a.workers:]
            rates = a.rates + ([a.train_rate] if not a.no_train and a.train_rate not in a.rates
                               else [])
            for rate in rates:
                cluster.shape(rate, a.latency_ms, a.burst_ms)
                probes[rate] = probe(plan, whosts, shosts, port)
                port += 10
                if rate in a.rates:
                    t0 = time.monotonic()
                    args = {"mb": a.mb, "tensors": a.tensors, "steps": a.steps,
                            "warmup": a.warmup, "configs": CONFIGS}
                    recs = run_job(plan, whosts, shosts,
                                   [sys.executable, WORKER, "bench", json.dumps(args)], port, a.timeout)
                    port += 1
                    rows += bench_rows(rate, recs, probes[rate])
                    print(f"[{rate}] bench job {time.monotonic() - t0:.0f} s", flush=True)
                    print(bench_table([r for r in rows if r["rate"] == rate], probes),
                          flush=True)
                if rate == a.train_rate and not a.no_train:
                    t0 = time.monotonic()
                    recs = run_job(plan, whosts, shosts,
                                   [sys.executable, WORKER, "train", json.dumps(train_args)], port,
                                   a.timeout * 2)
                    port += 1
                    trows = train_rows(rate, recs)
                    for r in trows:
                        r["target"] = a.target
                    print(f"[{rate}] train job {time.monotonic() - t0:.0f} s", flush=True)
                    print(train_table(trows, a.target), flush=True)
    except NetnsError as exc:
        print(f"compression benchmark: {exc}", file=sys.stderr)
        return 2
    except jobs.JobError as exc:
        print(f"compression benchmark: a job failed: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.close()
        atexit.unregister(cluster.close)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    thr = None
    if not a.no_throughput:
        from benchmarks import compression_throughput as ct
        thr = ct.measure(a.throughput_n, 5)
    slow = min(a.rates, key=rate_bps)
    print()
    print(bench_table(rows, probes))
    print(train_table(trows, a.target))
    if thr:
        print(f"\ncompressor throughput, one core, {a.throughput_n:,} float32 "
              f"(benchmarks/compression_throughput.py):")
        print(ct.table(thr))
    print()
    v = verdicts(rows, trows, slow)
    print("\n".join(v))
    a.out.mkdir(parents=True, exist_ok=True)
    doc = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
           "seconds": time.time() - started, "cpu_count": os.cpu_count(),
           "loadavg_at_start": load0, "loadavg_at_end": os.getloadavg(),
           "machine_note": "shared VM, not quiet: other jobs ran during the benchmark",
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "configs": CONFIGS, "train_configs": TRAIN_CONFIGS, "train_task": train_args,
           "probes_Bps": probes, "rows": rows, "train": trows, "throughput": thr,
           "verdicts": v}
    js = a.out / ("compression_quick.json" if a.quick else "compression.json")
    js.write_text(json.dumps(doc, indent=1) + "\n")
    png = plot(rows, trows, js.with_suffix(".png"))
    print(f"wrote {js}" + (f" and {png}" if png else ""))
    print(f"total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scale model of byteps: validation against the emulated cluster, predictions to 1024 GPUs.

    .venv/bin/python benchmarks/scale_model.py [--calibration benchmarks/results/scale_calibration.json]
        [--out benchmarks/results/scaling]

The model itself is ``benchmarks/scale_sim.py`` (flow-level discrete-event simulation of the PS
data path with max-min fair full-duplex links, credits, partitions, per-message and per-byte
CPU costs; closed-form ring all-reduce).  The CPU costs come from
``benchmarks/scale_calibrate.py`` (measured on this machine through bpslaunch).

1. **Validation**: every byteps / byteps-coloc / gloo point of ``benchmarks/results/20261201-cluster-archive/*/``
   (2, 4 and 8 emulated hosts; 100 Mbit/s .. 1 Gbit/s), modelled with the link rate raw TCP
   reached in the same run, the run's partition size and credits, and this machine's 2 cores
   shared by all byteps processes; error per point.
2. **Predictions**: ResNet-50, VGG-16, BERT-large gradients at 8..1024 GPUs (8 per host, local
   reduction first: one network client per host) on 10/25/100 Gbit/s, for several servers per
   worker host, next to NCCL-style ring all-reduce; step time and scaling efficiency from
   published V100 throughputs; and the original BytePS's published 20 Gbit/s TCP comparison.

Writes ``validation.json``, ``predictions.json``, ``tables.md`` and PNG curves to ``--out``.
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.scale_sim import Cpu, ring_allreduce, simulate_ps
from benchmarks.tables import markdown

# ----------------------------------------------------------------------------- calibration

DEFAULT_CAL = {  # benchmarks/results/scale_calibration.json of 2026-11-30 (see docs/scaling.md)
    "a_msg_s": 81.0e-6, "b_byte_s": 0.866e-9, "np_add_Bps": 2.03e9,
    "worker_a_s": None, "worker_b_s": None,
}


def load_calibration(path: str | None) -> dict:
    cal = dict(DEFAULT_CAL)
    if path and Path(path).exists():
        d = json.loads(Path(path).read_text())
        cal.update({k: d[k] for k in ("a_msg_s", "b_byte_s", "np_add_Bps") if k in d})
        pts = d.get("points", [])
        if pts:  # the worker's own CPU seconds per op, fitted the same way
            A = np.array([[p["messages"], p["bytes"]] for p in pts], float)
            y = np.array([p["worker_cpu_s"] for p in pts], float)
            s = A.max(axis=0)
            c, *_ = np.linalg.lstsq(A / s, y, rcond=None)
            cal["worker_a_s"], cal["worker_b_s"] = (float(v) for v in np.maximum(c / s, 0))
    if cal["worker_a_s"] is None:
        cal["worker_a_s"], cal["worker_b_s"] = cal["a_msg_s"], cal["b_byte_s"]
    return cal


def measured_cpu(cal: dict, speed: float = 1.0, server_cores: int = 1) -> Cpu:
    """Worker: its own measured CPU per partition.  Server, per push received: the measured
    round trip (receive, send back: conservative, the whole wall-clock cost of the W=1 job)
    plus one np.add of the bytes."""
    return Cpu(a_w=cal["worker_a_s"], b_w=cal["worker_b_s"],
               a_s=cal["a_msg_s"], b_s=cal["b_byte_s"] + 1.0 / cal["np_add_Bps"],
               speed=speed, server_cores=server_cores)


# ----------------------------------------------------------------------------- validation

RATES = {"1gbit": 1e9, "500mbit": 5e8, "200mbit": 2e8, "100mbit": 1e8}
MACHINE_CORES = 2
EMU_LATENCY = 50e-6


def _env(args: dict, key: str, default: int) -> int:
    for kv in args.get("env", []):
        k, _, v = kv.partition("=")
        if k == key:
            return int(v)
    return default


def validation_points() -> list[dict]:
    pts = []
    for f in sorted(glob.glob(str(ROOT / "benchmarks/results/20261201-cluster-archive/*/results.json"))):
        d = json.loads(Path(f).read_text())
        a = d["args"]
        part = _env(a, "BYTEPS_PARTITION_BYTES", 4096000)
        credit = _env(a, "BYTEPS_SCHEDULING_CREDIT", 4)
        load = d.get("loadavg_at_end", [0])[0]
        for r in d.get("rows", []):
            if r["tensor_MB"] < 20:       # the train runs' tiny probe rows
                continue
            probe = d["probes"].get(r["rate"], {})
            pts.append({"folder": Path(f).parent.name, "system": r["system"], "rate": r["rate"],
                        "W": r["workers"], "S": r["servers"], "M": r["tensor_MB"] * 1e6,
                        "part": part, "credit": credit, "measured_s": r["time_s"],
                        "tcp_Bps": probe.get("all_Gbps", RATES[r["rate"]] / 1e9 * 0.955) * 1e9 / 8,
                        "idle": load < 3.0, "load": load})
    return pts


def model_point(p: dict, cal: dict) -> float:
    W, S, B, M = p["W"], p["S"], p["tcp_Bps"], p["M"]
    if p["system"] == "gloo":
        procs = W
        speed = min(1.0, MACHINE_CORES / procs)
        return ring_allreduce(M, W, B, latency_s=EMU_LATENCY, b_reduce=1.0 / cal["np_add_Bps"],
                              speed=speed)
    coloc = p["system"] == "byteps-coloc"
    procs = W + S                     # workers and servers share the 2 cores either way
    cpu = measured_cpu(cal, speed=min(1.0, MACHINE_CORES / procs))
    return simulate_ps(M, W, S, B, part=p["part"], credit=p["credit"], latency_s=EMU_LATENCY,
                       cpu=cpu, colocated=coloc).time_s


def hosts(p: dict) -> int:
    return p["W"] + (p["S"] if p["system"] == "byteps" else 0)


def validate(cal: dict) -> list[dict]:
    out = []
    for p in validation_points():
        m = model_point(p, cal)
        link_only = (model_point(p, {**cal, "a_msg_s": 0, "b_byte_s": 0, "worker_a_s": 0,
                                     "worker_b_s": 0, "np_add_Bps": 1e30}))
        out.append({**p, "hosts": hosts(p), "model_s": m, "model_link_only_s": link_only,
                    "error": m / p["measured_s"] - 1})
    return out


# ----------------------------------------------------------------------------- predictions

MODELS = {   # gradient bytes (fp32), V100 per-GPU throughput (published, see docs/scaling.md)
    "ResNet-50": {"params": 25.6e6, "per_gpu_per_s": 360.0, "batch": 64},
    "VGG-16": {"params": 138e6, "per_gpu_per_s": 230.0, "batch": 64},
    "BERT-large": {"params": 340e6, "per_gpu_per_s": 200.0, "batch": 64},
}
GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
LINKS_GBPS = [10, 25, 100]
TCP_EFF = 0.95           # raw TCP reached 0.95-0.956 of the shaped rate in every cluster run
DC_LATENCY = 25e-6       # one-way, same rack/cluster
RING_STEP_LATENCY = 10e-6
NVLINK_Bps = 130e9       # NCCL all-reduce bus bandwidth inside a DGX-1-class V100 host
PCIE_Bps = 12e9          # GPU <-> host copy per direction (PCIe 3 x16), pipelined with the network
LOCAL = 8
SERVERS_PER_HOST = [0.5, 1.0, 2.0]
FWD_FRACTION = 1 / 3     # forward : backward = 1 : 2; communication overlaps backward only


def grad_bytes(model: str) -> float:
    return MODELS[model]["params"] * 4


def compute_s(model: str) -> float:
    m = MODELS[model]
    return m["batch"] / m["per_gpu_per_s"]


def step_time(tc: float, comm: float, overlap: bool = True) -> float:
    if not overlap:
        return tc + comm
    return FWD_FRACTION * tc + max((1 - FWD_FRACTION) * tc, comm)


PART_GRID = [4096000, 2048000, 1024000, 512000, 256000]


@functools.cache
def ps_net(M: float, H: int, S: int, B: float, part: float, credit: int,
           cpu: Cpu | None) -> float:
    return simulate_ps(M, H, S, B, part=part, credit=credit, latency_s=DC_LATENCY,
                       cpu=cpu or Cpu()).time_s


def tuned_settings(M: float, H: int, S: int, B: float, cpu: Cpu | None) -> tuple[float, int, float]:
    """The partition size and credit (in partitions) the model finds best: the window must
    cover every server (credit >= S partitions), the partitions small enough that every server
    gets some and the window's tail is short; per-message CPU costs push the other way."""
    best = None
    for part in PART_GRID:
        if math.ceil(M / part) > 4000:
            continue
        credit = max(4, S)
        t = ps_net(M, H, S, B, part, credit, cpu)
        if best is None or t < best[2] - 1e-12:
            best = (part, credit, t)
    return best


def ps_comm(M: float, gpus: int, gbps: float, k: float, cpu: Cpu | None = None,
            tuned: bool = True) -> float:
    """PS communication time per step: local reduction among the host's 8 GPUs, then H hosts
    push_pull through S = k*H servers (separate machines, same NIC); the GPU<->host copy
    (PCIe) is pipelined with the network, so the slower of the two counts."""
    H = max(1, gpus // LOCAL)
    if H == 1:          # one host: local reduction only (no PS needed), same as the ring
        return ring_comm(M, gpus, gbps)
    S = max(1, round(k * H))
    B = gbps * 1e9 / 8 * TCP_EFF
    net = (tuned_settings(M, H, S, B, cpu)[2] if tuned
           else ps_net(M, H, S, B, 4096000, 4, cpu))
    local = M / PCIE_Bps if gpus > 1 else 0.0
    return max(net, local)


def ring_comm(M: float, gpus: int, gbps: float) -> float:
    if gpus <= LOCAL:   # inside one host: NVLink
        return ring_allreduce(M, gpus, NVLINK_Bps, latency_s=RING_STEP_LATENCY)
    B = gbps * 1e9 / 8 * TCP_EFF
    # flat NCCL ring over all GPUs: each host's NIC carries the ring's 2(N-1)/N * M
    return ring_allreduce(M, gpus, B, latency_s=RING_STEP_LATENCY)


def predictions(cal: dict) -> list[dict]:
    rows = []
    cpu_meas = measured_cpu(cal, server_cores=4)
    for model in MODELS:
        M, tc = grad_bytes(model), compute_s(model)
        for gbps in LINKS_GBPS:
            for g in GPUS:
                ring = ring_comm(M, g, gbps)
                r = {"model": model, "gbps": gbps, "gpus": g, "hosts": g // LOCAL,
                     "M": M, "compute_s": tc, "ring_comm_s": ring,
                     "ring_step_s": step_time(tc, ring)}
                for k in SERVERS_PER_HOST:
                    c = ps_comm(M, g, gbps, k)
                    r[f"ps_comm_k{k}"] = c
                    r[f"ps_step_k{k}"] = step_time(tc, c)
                c = ps_comm(M, g, gbps, 1.0, tuned=False)
                r["ps_comm_k1.0_defaults"] = c
                r["ps_step_k1.0_defaults"] = step_time(tc, c)
                for k in (1.0, 2.0):
                    cm = ps_comm(M, g, gbps, k, cpu_meas)
                    r[f"ps_comm_k{k}_measuredcpu"] = cm
                    r[f"ps_step_k{k}_measuredcpu"] = step_time(tc, cm)
                H = max(1, g // LOCAL)
                r["tuned_part_k1.0"], r["tuned_credit_k1.0"], _ = tuned_settings(
                    M, H, H, gbps * 1e9 / 8 * TCP_EFF, None)
                # colocated servers: a worker host's NIC carries 2(H-1)/H * M, like a ring
                col = (simulate_ps(M, H, H, gbps * 1e9 / 8 * TCP_EFF, latency_s=DC_LATENCY,
                                   part=512000, credit=max(4, H),
                                   colocated=True).time_s if H <= 16 else
                       2 * (H - 1) / H * M / (gbps * 1e9 / 8 * TCP_EFF))
                r["coloc_comm_s"] = max(col, M / PCIE_Bps) if H > 1 else ring
                r["coloc_step_s"] = step_time(tc, r["coloc_comm_s"])
                for key in list(r):
                    if key.endswith("step_s") or key.startswith("ps_step"):
                        r[key.replace("step", "eff")] = tc / r[key]
                rows.append(r)
    return rows


def published_comparison() -> list[dict]:
    """Original BytePS README: 8 V100 16GB per VM, NVLink, 20 Gbit/s TCP, fp32, batch 64 per
    GPU: +44 % ResNet-50, +100 % VGG-16 over Horovod (NCCL)."""
    out = []
    for model, pub in (("ResNet-50", 0.44), ("VGG-16", 1.00)):
        M, tc = grad_bytes(model), compute_s(model)
        for g in (16, 32, 64, 256):
            ring = ring_comm(M, g, 20)
            ps = ps_comm(M, g, 20, 1.0)
            row = {"model": model, "gpus": g, "published_gain": pub, "compute_s": tc,
                   "ring_comm_s": ring, "ps_comm_s": ps}
            for ov in (True, False):
                tag = "overlap" if ov else "no_overlap"
                row[f"gain_{tag}"] = step_time(tc, ring, ov) / step_time(tc, ps, ov) - 1
            # the ring efficiency (fraction of 20 Gbit/s NCCL-over-TCP would have to reach)
            # that reproduces the published gain, with overlap
            lo, hi = 0.05, 1.0
            target = 1 + pub
            for _ in range(60):
                mid = (lo + hi) / 2
                g_mid = step_time(tc, ring / mid) / step_time(tc, ps)
                lo, hi = (lo, mid) if g_mid < target else (mid, hi)
            row["ring_eff_needed"] = (lo + hi) / 2
            out.append(row)
    return out


# ----------------------------------------------------------------------------- output

def fmt_val_table(val: list[dict]) -> str:
    return markdown(
        ("folder", "system", "rate", "W", "S", "hosts", "partition", "measured s", "model s",
         "error", "link-only model s", "machine"),
        ((v["folder"], v["system"], v["rate"], v["W"], v["S"], v["hosts"],
          f"{v['part'] / 1e6:.1f} MB", f"{v['measured_s']:.3f}", f"{v['model_s']:.3f}",
          f"{v['error']:+.1%}", f"{v['model_link_only_s']:.3f}",
          "idle" if v["idle"] else f"load {v['load']:.0f}") for v in val))


def fmt_pred_table(rows: list[dict], gpus=(8, 64, 256, 1024)) -> str:
    return markdown(
        ("model", "link", "GPUs", "compute s", "ring comm s", "PS comm s (S=H, tuned)",
         "partition / credit", "ring eff.", "PS eff. S=H", "PS eff. S=H/2",
         "PS eff. S=H, defaults (4 MB x 4)", "PS/ring speed", "PS eff. measured CPU S=H / S=2H"),
        ((r["model"], f"{r['gbps']} G", r["gpus"], f"{r['compute_s']:.3f}",
          f"{r['ring_comm_s']:.3f}", f"{r['ps_comm_k1.0']:.3f}",
          f"{r['tuned_part_k1.0'] / 1e6:.3g} MB / {r['tuned_credit_k1.0']}",
          f"{r['ring_eff_s']:.2f}", f"{r['ps_eff_k1.0']:.2f}", f"{r['ps_eff_k0.5']:.2f}",
          f"{r['ps_eff_k1.0_defaults']:.2f}", f"{r['ring_step_s'] / r['ps_step_k1.0']:.2f}x",
          f"{r['ps_eff_k1.0_measuredcpu']:.2f} / {r['ps_eff_k2.0_measuredcpu']:.2f}")
         for r in rows if r["gpus"] in gpus))


def fmt_pub_table(pub: list[dict]) -> str:
    return markdown(
        ("model", "GPUs", "compute s/step", "ring comm s", "PS comm s", "model gain (overlap)",
         "model gain (no overlap)", "published", "NCCL-TCP efficiency that gives it"),
        ((r["model"], r["gpus"], f"{r['compute_s']:.3f}", f"{r['ring_comm_s']:.3f}",
          f"{r['ps_comm_s']:.3f}", f"{r['gain_overlap']:+.0%}", f"{r['gain_no_overlap']:+.0%}",
          f"{r['published_gain']:+.0%}", f"{r['ring_eff_needed']:.2f}") for r in pub))


def plots(rows: list[dict], val: list[dict], out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        p = out / name
        fig.savefig(p, dpi=90)
        plt.close(fig)
        files.append(str(p))

    fig, axes = plt.subplots(len(MODELS), len(LINKS_GBPS), figsize=(15, 11), sharex=True)
    for i, model in enumerate(MODELS):
        for j, gbps in enumerate(LINKS_GBPS):
            ax = axes[i][j]
            rs = [r for r in rows if r["model"] == model and r["gbps"] == gbps]
            g = [r["gpus"] for r in rs]
            ax.plot(g, [r["ring_eff_s"] for r in rs], "k--o", label="ring all-reduce (NCCL-style)")
            for k in SERVERS_PER_HOST:
                ax.plot(g, [r[f"ps_eff_k{k}"] for r in rs], "-o", ms=3,
                        label=f"PS, {k:g} server per worker host")
            ax.plot(g, [r["ps_eff_k1.0_defaults"] for r in rs], ":", color="red",
                    label="PS 1/host, defaults (4 MB x credit 4)")
            ax.plot(g, [r["ps_eff_k1.0_measuredcpu"] for r in rs], ":", color="gray",
                    label="PS 1/host, this implementation's CPU costs")
            ax.plot(g, [r["coloc_eff_s"] for r in rs], "-.", color="brown", label="PS colocated")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{model}, {gbps} Gbit/s")
            ax.grid(alpha=.3)
            if i == len(MODELS) - 1:
                ax.set_xlabel("GPUs (8 per host)")
            if j == 0:
                ax.set_ylabel("scaling efficiency")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("byteps scale model: scaling efficiency (compute / step time), V100 compute")
    save(fig, "scaling_efficiency.png")

    fig, ax = plt.subplots(figsize=(7, 6))
    for sysname, mk in (("byteps", "o"), ("byteps-coloc", "s"), ("gloo", "^")):
        vs = [v for v in val if v["system"] == sysname]
        ax.scatter([v["measured_s"] / (v["M"] / 1e8) for v in vs],
                   [v["model_s"] / (v["M"] / 1e8) for v in vs], marker=mk, label=sysname)
    lim = [0.5, 5.5]
    ax.plot(lim, lim, "k-", lw=.8)
    ax.fill_between(lim, [x * .85 for x in lim], [x * 1.15 for x in lim], color="g", alpha=.1,
                    label="+-15 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured s per 100 MB (emulated cluster)")
    ax.set_ylabel("model s per 100 MB")
    ax.legend()
    ax.grid(alpha=.3, which="both")
    ax.set_title("scale model vs emulated cluster")
    save(fig, "validation.png")

    fig, ax = plt.subplots(figsize=(7, 5))
    ks = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
    for model in MODELS:
        M = grad_bytes(model)
        for g, ls in ((256, "-"), (1024, "--")):
            ax.plot(ks, [ps_comm(M, g, 25, k) / (M / (25e9 / 8 * TCP_EFF)) for k in ks],
                    ls, marker="o", label=f"{model}, {g} GPUs")
    ax.set_xlabel("servers per worker host (same NIC)")
    ax.set_ylabel("PS communication time / (M/B)")
    ax.set_title("25 Gbit/s: servers needed to reach the M/B bound")
    ax.grid(alpha=.3)
    ax.legend(fontsize=8)
    save(fig, "servers_per_worker.png")
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=str(ROOT / "benchmarks/results/scale_calibration.json"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/scaling"))
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cal = load_calibration(a.calibration)
    print("calibration:", {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in cal.items()})
    val = validate(cal)
    rows = predictions(cal)
    pub = published_comparison()
    (out / "validation.json").write_text(json.dumps(val, indent=1))
    (out / "predictions.json").write_text(json.dumps(rows, indent=1))
    (out / "published.json").write_text(json.dumps(pub, indent=1))
    idle = [abs(v["error"]) for v in val if v["idle"]]
    allv = [abs(v["error"]) for v in val]
    summary = (f"validation: {len(val)} points, mean |error| {np.mean(allv):.1%}, max "
               f"{max(allv):.1%}; idle-machine points: mean {np.mean(idle):.1%}, max "
               f"{max(idle):.1%}; within 15 %: {sum(e <= .15 for e in allv)}/{len(allv)}")
    md = "\n\n".join(["## Validation", fmt_val_table(val), summary,
                      "## Predictions", fmt_pred_table(rows),
                      "## Published comparison (20 Gbit/s TCP)", fmt_pub_table(pub)])
    (out / "tables.md").write_text(md + "\n")
    print(md)
    if not a.no_plots:
        print("plots:", plots(rows, val, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

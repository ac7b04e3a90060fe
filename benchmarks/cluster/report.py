"""Turn raw per-rank results into rows, a table, JSON and a PNG plot (pure logic)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.cluster.netns import rate_bps

# bytes each worker link carries per direction, as a multiple of the tensor size M
TRAFFIC = {
    "byteps": lambda n: 1.0,                         # push M up, pull M down
    "byteps-nomarks": lambda n: 1.0,                 # the same loop without step_done()
    "byteps-coloc": lambda n: 2.0 * (n - 1) / n,     # the local server's share stays local
    "gloo": lambda n: 2.0 * (n - 1) / n,             # ring: reduce-scatter + all-gather
}


def job_time(records: list[dict]) -> float:
    """Time per operation of a job: the slowest rank's median iteration."""
    if not records:
        raise ValueError("no results")
    return max(statistics.median(r["times"]) for r in records)


def step_times(records: list[dict]) -> list[float]:
    """Every iteration's time from the first (warm-up included), the slowest rank's."""
    runs = [r["all_times"] for r in records if r.get("all_times")]
    return [max(ts) for ts in zip(*runs)] if runs else []


def make_row(system: str, rate: str, workers: int, servers: int, records: list[dict],
             gloo_s: float | None = None, link_Bps: float | None = None,
             mesh_Bps: float | None = None) -> dict:
    """One table row for ``system`` measured at ``rate`` with ``workers`` hosts.
    ``time_s``: the timed iterations (after the warm-up); ``from3_s``: the median from
    the 3rd step on, ``first2_s``: the mean of steps 1-2 (byteps rows; the slowest rank
    per step); ``vs_mesh``: the link rate as a fraction of the raw TCP worker-server mesh
    measured in the same run (the same pattern moved by the kernel alone)."""
    t = job_time(records)
    nbytes = records[0]["bytes"]
    bps = rate_bps(rate) / 8
    factor = TRAFFIC[system](workers)
    row = {"system": system, "rate": rate, "workers": workers, "servers": servers,
           "tensor_MB": nbytes / 1e6, "iters": len(records[0]["times"]), "time_s": t,
           "time_per_100MB_s": t * 100e6 / nbytes,
           "link_Gbps": factor * nbytes * 8 / t / 1e9,
           "bound_s": nbytes / bps, "vs_bound": (nbytes / bps) / t,
           "vs_gloo": (gloo_s / t) if gloo_s else None,
           "vs_measured_tcp": (factor * nbytes / t / link_Bps) if link_Bps else None,
           "vs_mesh": (factor * nbytes / t / mesh_Bps) if mesh_Bps else None,
           "per_rank_median_s": [statistics.median(r["times"]) for r in records]}
    steps = step_times(records)
    if len(steps) >= 3:
        row["from3_s"] = statistics.median(steps[2:])
        row["first2_s"] = sum(steps[:2]) / 2
        row["vs_gloo_from3"] = gloo_s / row["from3_s"] if gloo_s else None
        row["step_times_s"] = steps
    speeds = [r["speed_MBps"] for r in records if "speed_MBps" in r]
    if speeds:
        row["pushpull_speed_MBps"] = speeds
    row["worker_cpu_s_per_GB"] = cpu_per_gb(records)
    if records[0].get("config"):
        row["config"] = records[0]["config"]
    return row


def cpu_per_gb(records: list[dict]) -> float | None:
    """CPU seconds per GB a worker moved (sent + received) over the timed iterations,
    the median over ranks (every thread of the process: engine, ZeroMQ, user)."""
    per = [r["cpu_s"] / (r["moved_bytes"] / 1e9) for r in records
           if r.get("cpu_s") is not None and r.get("moved_bytes")]
    return statistics.median(per) if per else None


def train_row(system: str, rate: str, workers: int, records: list[dict],
              ddp_ips: float | None = None) -> dict:
    ips = [r["img_sec"] for r in records]
    total = sum(ips)
    return {"system": system, "rate": rate, "workers": workers, "img_sec_total": total,
            "img_sec_per_worker": total / len(ips), "vs_ddp": (total / ddp_ips) if ddp_ips
            else None, "model": records[0].get("model"), "batch": records[0].get("batch"),
            "phase_s": _slowest_phases(records)}


def _slowest_phases(records: list[dict]) -> dict | None:
    """Each phase's median step time (forward, backward, optimizer step), the slowest rank's."""
    got = [r["phase_s"] for r in records if r.get("phase_s")]
    return {k: max(p[k] for p in got) for k in got[0]} if got else None


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def drop_pct(row: dict) -> float | None:
    """Packets the shaped links dropped during the row's job, in percent."""
    d = row.get("link_drops") or {}
    return 100.0 * d["dropped"] / d["packets"] if d.get("packets") else None


def table(rows: list[dict], probes: dict) -> str:
    lines = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        p = probes.get(rate, {})
        lines.append(f"link {rate}: raw TCP per direction, one pair "
                     f"{_fmt(p.get('pair_Gbps'), '.3f')} Gbit/s; all worker links at once "
                     f"{_fmt(p.get('all_Gbps'), '.3f')} Gbit/s each; the worker-server mesh "
                     f"{_fmt(p.get('mesh_Gbps'), '.3f')} Gbit/s per worker link each way")
        rounds = max(r.get("round", 1) for r in rows)
        nw = 19 if rounds > 1 else 15           # "byteps-nomarks #2"
        lines.append(f"{'system':<{nw}}{'W':>3}{'S':>3}{'MB':>5}{'s/op':>7}{'Gb/s/link':>10}"
                     f"{'vs gloo':>8}{'vs mesh':>8}{'mesh':>6}{'vs M/B':>7}{'vs TCP':>7}"
                     f"{'drop%':>6}"
                     f"{'steps1-2':>9}{'from3':>7}{'x gloo':>7}"
                     f"{'wCPU s/GB':>10}{'sCPU s/GB':>10}")
        for r in rows:
            if r["rate"] != rate:
                continue
            name = r["system"] + (f" #{r.get('round', 1)}" if rounds > 1 else "")
            lines.append(f"{name:<{nw}}{r['workers']:>3}{r['servers']:>3}"
                         f"{r['tensor_MB']:>5.0f}{r['time_s']:>7.3f}{r['link_Gbps']:>10.3f}"
                         f"{_fmt(r['vs_gloo'], '.2f'):>8}{_fmt(r.get('vs_mesh'), '.2f'):>8}"
                         f"{_fmt(r.get('mesh_Gbps'), '.3f'):>6}{r['vs_bound']:>7.2f}"
                         f"{_fmt(r['vs_measured_tcp'], '.2f'):>7}{_fmt(drop_pct(r), '.2f'):>6}"
                         f"{_fmt(r.get('first2_s'), '.3f'):>9}{_fmt(r.get('from3_s'), '.3f'):>7}"
                         f"{_fmt(r.get('vs_gloo_from3'), '.2f'):>7}"
                         f"{_fmt(r.get('worker_cpu_s_per_GB'), '.2f'):>10}"
                         f"{_fmt(r.get('server_cpu_s_per_GB'), '.2f'):>10}")
        lines.append("s/op, vs gloo, vs mesh: the timed iterations after the warm-up; mesh: "
                     "the raw mesh's Gbit/s per link, the faster of its runs just before "
                     "and after the row; steps1-2: the mean of the first two steps; from3: the "
                     "median from the 3rd step on (warm-up included), x gloo: its ratio to "
                     "gloo's s/op")
        if rounds > 1:
            lines += round_medians([r for r in rows if r["rate"] == rate])
        lines.append("")
    return "\n".join(lines)


def round_medians(rows: list[dict]) -> list[str]:
    """Per system and W, the median over rounds of each ratio (and the rounds' range)."""
    out = []
    for key in dict.fromkeys((r["system"], r["workers"]) for r in rows):
        got = [r for r in rows if (r["system"], r["workers"]) == key]
        parts = []
        for col, label in (("vs_gloo", "vs gloo"), ("vs_mesh", "vs mesh"),
                           ("vs_gloo_from3", "x gloo from step 3")):
            vs = [r[col] for r in got if r.get(col) is not None]
            if vs:
                parts.append(f"{label} {statistics.median(vs):.2f} "
                             f"({min(vs):.2f}-{max(vs):.2f})")
        if parts and key[0] != "gloo":
            out.append(f"{key[0]} W={key[1]}, median of {len(got)} rounds: " + ", ".join(parts))
    return out


def train_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [f"{'training':<14}{'rate':>9}{'W':>3}{'img/s total':>13}{'vs DDP':>8}"
             f"{'fwd ms':>8}{'bwd ms':>8}{'step ms':>9}{'  main thread CPU ms':>21}"]
    rounds = max(r.get("round", 1) for r in rows)
    for r in rows:
        ph = r.get("phase_s") or {}
        ms = [_fmt(ph[k] * 1e3 if k in ph else None, '.0f') for k in
              ("forward", "backward", "opt_step")]
        name = r["system"] + (f" #{r.get('round', 1)}" if rounds > 1 else "")
        lines.append(f"{name:<14}{r['rate']:>9}{r['workers']:>3}"
                     f"{r['img_sec_total']:>13.1f}{_fmt(r['vs_ddp'], '.2f'):>8}"
                     f"{ms[0]:>8}{ms[1]:>8}{ms[2]:>9}   " + " / ".join(
                         _fmt(ph[k] * 1e3 if k in ph else None, '.0f') for k in
                         ("forward_cpu", "backward_cpu", "opt_step_cpu")))
    for system in dict.fromkeys(r["system"] for r in rows if r.get("vs_ddp") is not None):
        vs = [r["vs_ddp"] for r in rows if r["system"] == system and r.get("vs_ddp")]
        if len(vs) > 1:
            lines.append(f"{system} vs DDP, median of {len(vs)} rounds: "
                         f"{statistics.median(vs):.2f} ({min(vs):.2f}-{max(vs):.2f})")
    return "\n".join(lines)


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def plot(rows: list[dict], path: Path) -> Path | None:
    """Time per 100 MB vs W, one panel per link rate (None if matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        sub = [r for r in rows if r["rate"] == rate]
        for system in dict.fromkeys(r["system"] for r in sub):
            ws_ = sorted({r["workers"] for r in sub if r["system"] == system})
            pts = [(w, statistics.median(r["time_per_100MB_s"] for r in sub   # over rounds
                                         if r["system"] == system and r["workers"] == w))
                   for w in ws_]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
        ws = sorted({r["workers"] for r in sub})
        bound = 100e6 * 8 / rate_bps(rate)
        ax.plot(ws, [bound] * len(ws), "k--", label="PS link bound M/B")
        ax.plot(ws, [bound * 2 * (w - 1) / w for w in ws], "k:", label="ring bound 2(W-1)/W M/B")
        ax.set_title(f"push_pull / all_reduce at {rate} per host")
        ax.set_xlabel("workers (hosts)")
        ax.set_ylabel("seconds per 100 MB")
        ax.set_xticks(ws)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


STAGES = ("queue", "push", "server+pull", "copy_out", "server_sum (est.)")


def trace_summary(trace_dir: Path) -> dict:
    """Mean span lengths (ms) over the Chrome traces of every worker in ``trace_dir``."""
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    tensors: list[float] = []
    ranks = 0
    for f in sorted(Path(trace_dir).glob("*/comm.json")):
        try:
            evs = json.loads(f.read_text())["traceEvents"]
        except (OSError, ValueError, KeyError):
            continue
        ranks += 1
        for e in evs:
            if e.get("ph") != "X":
                continue
            if e.get("cat") == "tensor":
                tensors.append(e["dur"] / 1e3)
            elif e.get("name") in per_stage:
                per_stage[e["name"]].append(e["dur"] / 1e3)
    def mean(xs):
        return sum(xs) / len(xs) if xs else None
    return {"ranks": ranks, "tensor_ms": mean(tensors),
            "partitions": len(per_stage["queue"]),
            "stage_ms": {s: mean(v) for s, v in per_stage.items()}}


def trace_table(traces: dict) -> str:
    """Where a push_pull's time goes, from the timelines (mean per partition, ms)."""
    if not traces:
        return ""
    lines = [f"{'timeline (ms)':<26}{'op':>8}" + "".join(f"{s[:11]:>12}" for s in STAGES)]
    for name, t in traces.items():
        st = t.get("stage_ms", {})
        lines.append(f"{name:<26}{_fmt(t.get('tensor_ms'), '.1f'):>8}"
                     + "".join(f"{_fmt(st.get(s), '.1f'):>12}" for s in STAGES))
    return "\n".join(lines)

"""Training across regions (issue 26): DiLoCo against synchronous training over an
emulated wide-area network (not a test).

    sudo .venv/bin/python -m benchmarks.wide_area                   # the full run
    sudo .venv/bin/python -m benchmarks.wide_area --steps 40 --inner-steps 10 --dim 32 \\
        --algos sync,diloco_int8,streaming,ddp                       # a short smoke run
    sudo .venv/bin/python -m benchmarks.wide_area --cleanup         # remove leftovers

W worker hosts (default 4) and one server host (which also runs the scheduler) are
network namespaces on one bridge (benchmarks/cluster/netns.py).  Every worker trains the
same character-level transformer (benchmarks/wide_area_worker.py) on the Python standard
library's source for the same number of tokens, with one method:

* ``ddp``: torch.distributed gloo allreduce of the gradients every step;
* ``sync`` / ``sync_onebit``: SyncPS, float32 / onebit with error feedback;
* ``diloco`` / ``diloco_int8``: DiLoCo (``--inner-steps``), float32 / int8 outer gradients;
* ``streaming``: Streaming DiLoCo, ``--fragments`` fragments, int8, overlapped by at
  most ``--overlap`` inner steps (``DiLoCo(overlap=k)``);
* ``diloco_int8_long``: DiLoCo int8 for ``--long-factor`` times the steps (more tokens
  than the others; its lr schedule spans its own steps): the race to SyncPS's final loss,
  which DiLoCo does not reach at equal tokens.

The network: every worker's connections to the server go through the user-space proxy
(benchmarks/cluster/delay_proxy.py; this kernel has no ``netem``) that holds each chunk
``--delay-ms`` one way and serialises each direction at ``--rate-mbit``, i.e. a link of
that speed and latency to the server's region.  DDP's gloo connects worker to worker, on
ephemeral ports: in the DDP run every other worker's address is made local in each
worker namespace (AnyIP, so the proxy receives the connections), each namespace gets its
own narrow ephemeral range and the proxy listens on every port gloo's listener can take
(``gloo_links``), so DDP's traffic crosses the same proxy with the same delay and rate.
DDP's gradients go in one allreduce per step (DDP's 25 MB bucket holds the whole model).

Reported, per method (rank 0's clock, evaluation excluded): training seconds, bytes sent
per worker (training only: the initial broadcast and seed excluded) and the ratio against
SyncPS float32, the bytes received (DiLoCo pulls the global parameters in full precision
once per round), the peak link usage as the bytes of the largest single exchange a worker
sends (one step's allreduce or push_pull; one outer round of the largest fragment: the
link rate needed to finish an exchange in a given time is proportional to it, the
Streaming DiLoCo paper's "peak bandwidth") against DiLoCo int8's, the time rank 0 first
reached the final validation loss of SyncPS (its own model; DDP's training time, a lower
bound, when rounding leaves DDP just above it), that ratio against DDP, and the final
validation loss after ``finish()`` against SyncPS's.  A table on stdout, results.json,
table.txt and wide_area.png in a new folder
(benchmarks/results/<YYYYMMDD>-wide-area-<steps>steps-<workers>w-<HHMM>/ unless --out).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.algorithms import PORTS as PROXIED  # the ports proxy_links forwards
from benchmarks.algorithms import latency_setup, proxy_links, vip
from benchmarks.cluster import jobs
from benchmarks.cluster.netns import Cluster, NetnsError, Plan, cleanup, run_cmds

HERE = Path(__file__).resolve().parent
#: the one method that does not train the same tokens: DiLoCo int8 for --long-factor x
#: the steps (its lr schedule spans its own steps), the race to SyncPS's final loss
LONG = "diloco_int8_long"
ALGOS = ("ddp", "sync", "sync_onebit", "diloco", "diloco_int8", "streaming", LONG)
PORTS = {"scheduler": 9700, "gloo": 9650, "server": PROXIED["server"],
         "peer": PROXIED["peer"]}
#: DDP through the proxy: gloo's listener takes an ephemeral port, so worker k's
#: namespace gets its own ephemeral range (GLOO_BASE + 32 k, 32 ports) and the proxy
#: listens, in every other worker's namespace, on the odd ports of it (bind(0) takes odd
#: ports, connect() even ones; the ranges are disjoint so that neither collides with the
#: proxy's listeners in its own namespace)
GLOO_BASE = 40000


def gloo_range(k: int) -> tuple[int, int]:
    return GLOO_BASE + 32 * k, GLOO_BASE + 32 * k + 31


def gloo_links(plan: Plan, nworkers: int, master_port: int) -> list[dict]:
    """From every worker namespace to every other worker's bridge address: gloo's
    possible listening ports and, to rank 0, the TCPStore's MASTER_PORT."""
    workers = plan.hosts[:nworkers]
    links = []
    for g in workers:
        for k, w in enumerate(workers):
            if w.index == g.index:
                continue
            lo, hi = gloo_range(k)
            ports = list(range(lo + 1, hi + 1, 2)) + ([master_port] if k == 0 else [])
            links += [{"listen_ns": g.ns, "ip": w.ip, "port": p, "target_ns": w.ns}
                      for p in ports]
    return links


def gloo_net(plan: Plan, nworkers: int, on: bool) -> list[list[str]]:
    """Every other worker's bridge address local in each worker namespace (AnyIP, from
    the namespace's own address) so that the proxy receives gloo's connections, and each
    namespace's ephemeral range; off: the routes removed, the default range back."""
    workers = plan.hosts[:nworkers]
    cmds = []
    for k, g in enumerate(workers):
        rng = "%d %d" % (gloo_range(k) if on else (32768, 60999))
        cmds.append(["ip", "netns", "exec", g.ns, "sysctl", "-q", "-w",
                     f"net.ipv4.ip_local_port_range={rng}"])
        cmds += [["ip", "-n", g.ns, "route", "add" if on else "del", "local", f"{w.ip}/32",
                  "dev", "lo", "src", g.ip] for w in workers if w.index != g.index]
    return cmds


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks.wide_area", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--delay-ms", type=float, default=50.0, help="one way")
    ap.add_argument("--steps", type=int, default=600, help="per worker (same tokens)")
    ap.add_argument("--inner-steps", type=int, default=30)
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--overlap", type=int, default=1,
                    help="streaming's DiLoCo(overlap=k): merged at most k inner steps after "
                         "the push (0: overlap=True, whenever it arrives)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step and worker")
    ap.add_argument("--outer-lr", type=float, default=1.0, help="DiLoCo's outer_lr")
    ap.add_argument("--outer-momentum", type=float, default=0.4,
                    help="DiLoCo's outer_momentum (Nesterov)")
    ap.add_argument("--lr", type=float, default=1.2e-2, help="AdamW's (inner) lr")
    ap.add_argument("--diloco-lr", type=float, default=None,
                    help="the DiLoCo methods' inner AdamW lr (default: --lr), for a batch "
                         "at which the methods' best lrs differ")
    ap.add_argument("--warmup", type=int, default=50, help="lr warm-up steps (every method)")
    ap.add_argument("--min-lr", type=float, default=0.1,
                    help="cosine lr decay to this fraction (every method; 1: constant)")
    ap.add_argument("--long-factor", type=float, default=2.0,
                    help="diloco_int8_long trains this many times --steps")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cleanup", action="store_true")
    return ap.parse_args(argv)


def steps_of(a, algo: str) -> int:
    return round(a.steps * a.long_factor) if algo == LONG else a.steps


def lr_of(a, algo: str) -> float:
    diloco = algo.startswith("diloco") or algo == "streaming"
    return a.diloco_lr if diloco and a.diloco_lr is not None else a.lr


def worker_argv(a, algo: str) -> list[str]:
    return [sys.executable, str(HERE / "wide_area_worker.py"), "--algo", algo, "--steps",
            str(steps_of(a, algo)), "--inner-steps", str(a.inner_steps), "--fragments",
            str(a.fragments), "--overlap", str(a.overlap), "--dim", str(a.dim),
            "--eval-every", str(a.eval_every),
            "--batch", str(a.batch), "--outer-lr", str(a.outer_lr), "--outer-momentum",
            str(a.outer_momentum), "--lr", str(lr_of(a, algo)), "--warmup", str(a.warmup),
            "--min-lr", str(a.min_lr)]


def specs_for(plan: Plan, a, algo: str, run: int) -> list:
    hosts = plan.hosts
    workers, server = hosts[:a.workers], hosts[a.workers]
    if algo == "ddp":
        return jobs.gloo_job(workers, worker_argv(a, algo), PORTS["gloo"] + run)
    env = {"BYTEPS_ENABLE_IPC": 0, "BYTEPS_SERVER_PORT": PORTS["server"] + run,
           "BYTEPS_PEER_PORT": PORTS["peer"] + run, "BYTEPS_HEARTBEAT_TIMEOUT": 60,
           "BYTEPS_MIN_COMPRESS_BYTES": 0}
    specs = jobs.byteps_job(workers, [server], server, worker_argv(a, algo),
                            PORTS["scheduler"] + run, env)
    for s in specs:                # services on the per-host addresses the proxy serves
        if s.env.get("DMLC_ROLE") in ("server", "worker"):
            s.env["DMLC_NODE_HOST"] = vip(s.host.index)
    return specs


def run_all(a) -> dict:
    algos = [x for x in a.algos.split(",") if x]
    bad = [x for x in algos if x not in ALGOS]
    if bad:
        raise SystemExit(f"unknown method(s) {bad}; choose from {ALGOS}")
    plan = Plan.new(a.workers + 1)
    out: dict = {"config": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(a).items()}, "results": {}}
    with Cluster(plan) as cluster:
        run_cmds(latency_setup(plan, a.workers))
        for run, algo in enumerate(algos, 1):
            proxy = None
            try:
                cluster.shape(None)
                if algo == "ddp":
                    run_cmds(gloo_net(plan, a.workers, True))
                    links = gloo_links(plan, a.workers, PORTS["gloo"] + run)
                else:
                    links = proxy_links(plan, a.workers, run)
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                    json.dump(links, f)
                proxy = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.cluster.delay_proxy", f.name,
                     str(a.delay_ms), str(a.rate_mbit)],
                    cwd=jobs.ROOT, stdout=subprocess.DEVNULL)
                time.sleep(1.0 + len(links) / 200)
                t0 = time.monotonic()
                recs = jobs.collect(jobs.run_specs(plan, specs_for(plan, a, algo, run),
                                                   a.timeout))
            except jobs.JobError as exc:          # the other methods still run
                print(f"{algo}: failed: {str(exc)[-3000:]}", flush=True)
                out["failed"] = {**out.get("failed", {}), algo: str(exc)[-3000:]}
                continue
            finally:
                if proxy is not None:
                    proxy.kill()
                    proxy.wait(10)
                if algo == "ddp":
                    run_cmds(gloo_net(plan, a.workers, False), check=False)
            r0 = next(r for r in recs if r["rank"] == 0)
            res = {"train_s": r0["train_s"], "wall_s": time.monotonic() - t0,
                   "sent_bytes": max(r["sent_bytes"] for r in recs),
                   "received_bytes": max(r["received_bytes"] for r in recs),
                   "exchange_sent": max(r["exchange_sent"] for r in recs),
                   "exchange_received": max(r["exchange_received"] for r in recs),
                   "final_loss": r0["final_loss"],   # the curve ends with the final model
                   "curve": r0["curve"] + [[r0["train_s"], r0["final_loss"]]],
                   "tokens": r0["tokens"], "params": r0["params"],
                   "merge_delay_steps": r0.get("merge_delay_steps"),
                   "merge_delay_steps_by_rank": [r.get("merge_delay_steps") for r in
                                                 sorted(recs, key=lambda r: r["rank"])]}
            out["results"][algo] = res
            print(f"{algo:12s} {res['train_s']:8.1f} s  {res['sent_bytes'] / 1e6:9.2f} MB sent  "
                  f"final loss {res['final_loss']:.3f}", flush=True)
    summarize(out)
    return out


def summarize(doc: dict) -> None:
    """Ratios against SyncPS float32 (bytes, loss), DDP (time to SyncPS's final loss) and
    DiLoCo int8 (the largest single exchange)."""
    res = doc["results"]
    sync, dil = res.get("sync"), res.get("diloco_int8")
    target = sync["final_loss"] if sync else None
    doc["target_loss"] = target
    for r in res.values():         # also the time to within 2 % of it (the loss bar)
        for key, bar in (("time_to_target_s", 1.0), ("time_to_target_2pct_s", 1.02)):
            r[key] = (next((t for t, v in r["curve"] if v <= target * bar), None)
                      if target is not None else None)
    ddp = res.get("ddp")
    for r in res.values():
        r["bytes_vs_sync"] = (sync["sent_bytes"] / r["sent_bytes"]
                              if sync and r["sent_bytes"] else None)
        r["loss_vs_sync"] = r["final_loss"] / sync["final_loss"] - 1 if sync else None
        r["tokens_vs_sync"] = r["tokens"] / sync["tokens"] if sync else None
        # DDP computes SyncPS's updates (same data, same start): when rounding leaves it
        # just above SyncPS's final loss, it had not reached it by its last step, so its
        # training time is a lower bound of its time to the target
        t, lower = (ddp["time_to_target_s"], False) if ddp else (None, False)
        if ddp and t is None:
            t, lower = ddp["train_s"], True
        r["speedup_vs_ddp"] = t / r["time_to_target_s"] if t and r["time_to_target_s"] \
            else None
        r["speedup_is_lower_bound"] = lower
        r["exchange_vs_diloco_int8"] = (r["exchange_sent"] / dil["exchange_sent"]
                                        if dil and dil["exchange_sent"] else None)


def _f(v, fmt: str) -> str:
    """``v`` formatted, or "-" padded to the format's width."""
    width = fmt.split(".")[0].lstrip("+- ") or "0"
    return format(v, fmt) if v is not None else format("-", f">{width}")


def table(doc: dict) -> str:
    c = doc["config"]
    sync = doc["results"].get("sync")
    lines = [f"{c['workers']} workers, {c['rate_mbit']:g} Mbit/s + {c['delay_ms']:g} ms one "
             f"way to the server, {c['steps']} steps per worker, H = {c['inner_steps']}, "
             f"target loss = SyncPS's final {_f(doc.get('target_loss'), '.3f')}"
             + (f"; {LONG}: {c.get('long_factor', 2.0):g}x the steps"
                if LONG in doc["results"] else ""),
             f"{'method':16s} {'train s':>8s} {'MB sent':>9s} {'sync/this':>9s} "
             f"{'MB recv':>8s} {'exch KB':>8s} {'/dil8':>6s} {'tokens':>6s} "
             f"{'to target':>9s} {'vs DDP':>7s} {'to +2%':>7s} {'final loss':>10s} "
             f"{'vs sync':>8s}"]
    for algo, r in doc["results"].items():
        up = _f(r["speedup_vs_ddp"], "6.1f")
        up = (">" if r["speedup_is_lower_bound"] and r["speedup_vs_ddp"] else " ") + up
        lines.append(f"{algo:16s} {r['train_s']:8.1f} {r['sent_bytes'] / 1e6:9.2f} "
                     f"{_f(r['bytes_vs_sync'], '9.1f')} {r['received_bytes'] / 1e6:8.2f} "
                     f"{r['exchange_sent'] / 1e3:8.1f} "
                     f"{_f(r['exchange_vs_diloco_int8'], '6.2f')} "
                     f"{_f(r.get('tokens_vs_sync'), '5.1f')}{'x' if sync else ' '} "
                     f"{_f(r['time_to_target_s'], '9.1f')} {up:>7s} "
                     f"{_f(r['time_to_target_2pct_s'], '7.1f')} "
                     f"{r['final_loss']:10.3f} {_f(r['loss_vs_sync'], '+8.1%')}")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(13, 5))
    for algo, r in doc["results"].items():
        if r["curve"]:
            t, v = zip(*r["curve"])
            ax[0].plot(t, v, label=algo)
    if doc.get("target_loss") is not None:
        ax[0].axhline(doc["target_loss"], color="grey", linestyle=":")
    ax[0].set_xlabel("seconds (rank 0, evaluation excluded)")
    ax[0].set_ylabel("validation loss (rank 0's model)")
    ax[0].legend()
    names = list(doc["results"])
    ax[1].bar(names, [doc["results"][n]["sent_bytes"] / 1e6 for n in names])
    ax[1].set_yscale("log")
    ax[1].tick_params(axis="x", rotation=30)
    ax[1].set_ylabel("MB sent per worker (training)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cleanup:
        print("removed:", cleanup(include_live=False))
        return 0
    out_dir = a.out or HERE / "results" / time.strftime(
        f"%Y%m%d-wide-area-{a.steps}steps-{a.workers}w-%H%M", time.gmtime())
    try:
        doc = run_all(a)
    except (NetnsError, jobs.JobError) as exc:
        print(f"benchmarks.wide_area: {exc}", file=sys.stderr)
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1))   # first: the run
    text = table(doc)
    print(text)
    (out_dir / "table.txt").write_text(text + "\n")
    plot(doc, out_dir / "wide_area.png")
    print(f"wrote {out_dir}/results.json, table.txt, wide_area.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

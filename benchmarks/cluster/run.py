"""Emulated-cluster benchmark: byteps (separate servers, colocated) vs gloo all_reduce.

    sudo .venv/bin/python -m benchmarks.cluster.run                  # the default sweep
    sudo .venv/bin/python -m benchmarks.cluster.run --rates 1gbit --workers 4 --train
    sudo .venv/bin/python -m benchmarks.cluster.run --burst-ms 10    # the old 10 ms bucket
    sudo .venv/bin/python -m benchmarks.cluster.run --cleanup        # remove leftovers

Builds W worker hosts and S server hosts as network namespaces on one
bridge, shapes every host's link with tc tbf (both directions), and runs on
them, for every rate and W: raw TCP (the physical limit: one pair, every link at once,
and the worker-server mesh, the PS pattern moved by the kernel alone), byteps with the
servers on their own hosts (a loop marking its steps, and the same loop without
step_done(), measured from its 3rd step), byteps with a server beside each worker, and
torch.distributed gloo all_reduce over the worker hosts.  Prints a table with byteps
as a fraction of the raw mesh next to its ratio to gloo, writes results.json, a PNG plot
and one Chrome trace per byteps worker into a new folder per run
(benchmarks/results/<UTC date-time>-cluster-<rates>-w<W>-<burst>ms/ unless --out is
given; an existing results.json is never overwritten).  The table has each system's CPU
seconds per GB moved: workers over the timed iterations, servers over their whole life.
Everything is torn down at the end, on errors, on Ctrl-C and on SIGTERM.
"""
from __future__ import annotations

import argparse
import atexit
import os
import platform
import signal
import sys
import time
from pathlib import Path

from benchmarks.cluster import jobs, pipeline, report
from benchmarks.cluster.netns import (Cluster, NetnsError, Plan, cleanup, rate_bps,
                                      run_cmds, tcp_cc_name)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SYSTEMS = ("byteps", "byteps-nomarks", "byteps-coloc", "gloo")


def _checked(kind):
    """An argparse type from ``kind`` whose ValueError message reaches the user."""
    def parse(text: str):
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _csv(kind):
    return _checked(lambda text: [kind(x) for x in text.split(",") if x.strip()])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks.cluster.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=_csv(str), default=["1gbit", "500mbit", "200mbit"],
                    help="link rates per host (tc syntax), comma separated")
    ap.add_argument("--workers", type=_csv(int), default=[2, 4], help="W values")
    ap.add_argument("--servers", type=int, default=0,
                    help="server hosts of the non-colocated runs (default: S = W)")
    ap.add_argument("--size-mb", type=float, default=100.0, help="tensor MB at >= 500mbit")
    ap.add_argument("--slow-size-mb", type=float, default=25.0,
                    help="tensor MB below 500mbit (keeps one run short)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, alternating (byteps, gloo, "
                         "byteps, gloo, ...): each round has its own ratios, and the table "
                         "ends with their medians; the emulated links' speed drifts "
                         "between minutes on a shared machine")
    ap.add_argument("--warmup", type=int, default=20,
                    help="untimed iterations first (autotune decides within 19 steps)")
    ap.add_argument("--systems", type=_csv(str), default=list(SYSTEMS))
    ap.add_argument("--probe-seconds", type=float, default=3.0)
    ap.add_argument("--burst-ms", type=float, default=2.0,
                    help="tbf bucket in ms of traffic at the link rate (default 2: a real "
                         "port never sends faster than its rate; 10 was the old default)")
    ap.add_argument("--latency-ms", type=float, default=50.0,
                    help="tbf queue: packets waiting longer are dropped (the switch buffer)")
    ap.add_argument("--tcp-cc", type=_checked(tcp_cc_name), default=None, metavar="NAME",
                    help="TCP congestion control in every emulated host (cubic, bbr, reno; "
                         "default: the machine's, recorded in results.json)")
    ap.add_argument("--train", action="store_true", help="also run the training variant")
    ap.add_argument("--train-only", action="store_true",
                    help="only the training variant (no probes, no push_pull rows)")
    ap.add_argument("--train-rate", default="1gbit")
    ap.add_argument("--train-workers", type=int, default=4)
    ap.add_argument("--cross-barrier", action="store_true",
                    help="training variant: also byteps with bps.CrossBarrier (the next "
                         "forward pass overlaps the exchange), each round")
    ap.add_argument("--ddp-heap", action="store_true",
                    help="training variant: also DDP with glibc's allocator set as byteps sets "
                         "its own (BYTEPS_MALLOC_TUNE: MALLOC_MMAP_MAX_=0, ...), each round")
    ap.add_argument("--train-args", default="--width 4096 --batch 32 --steps 6 --warmup 20",
                    help="train_mlp.py options (the warm-up covers autotune's trials)")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for every byteps process (e.g. BYTEPS_SCHEDULING_CREDIT=8)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: results/<UTC time>-<burst>ms, new per run)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per job")
    ap.add_argument("--cleanup", action="store_true",
                    help="only remove namespaces left by dead runs, then exit")
    a = ap.parse_args(argv)
    if a.train_only:
        a.train, a.rates, a.workers = True, [], [a.train_workers]
    bad = [s for s in a.systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
    if any(w < 1 for w in a.workers) or a.iters < 1 or a.warmup < 0 or a.rounds < 1:
        ap.error("--workers must be >= 1, --iters >= 1, --warmup >= 0, --rounds >= 1")
    for r in a.rates + [a.train_rate]:
        try:
            rate_bps(r)
        except ValueError as exc:
            ap.error(str(exc))
    for kv in a.env:
        if "=" not in kv:
            ap.error(f"--env {kv!r}: expected KEY=VALUE")
    if a.out is None:           # named by date and content (docs/cluster.md)
        a.out = ROOT / "benchmarks" / "results" / (
            time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-cluster-" + "-".join(a.rates)
            + "-w" + "-".join(map(str, a.workers)) + ("-train" if a.train else "")
            + f"-{a.burst_ms:g}ms")
        if a.train_only:
            a.out = a.out.with_name(a.out.name.replace("-cluster--w", "-cluster-train-"
                                                       + a.train_rate + "-w"))
    return a


def fresh(path: Path) -> Path:
    """``path``, or ``path`` with -1, -2, ... before the suffix if it exists (results of
    earlier runs are kept)."""
    n, p = 0, path
    while p.exists():
        n += 1
        p = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return p


def _g(v: float | None) -> str:
    return report._fmt(v, ".3f")


def server_hosts(a: argparse.Namespace) -> int:
    """Hosts that only run servers (the non-colocated runs and the training variant)."""
    if not {"byteps", "byteps-nomarks"} & set(a.systems) and not a.train:
        return 0
    return a.servers or max(a.workers + ([a.train_workers] if a.train else []))


class Runner:
    def __init__(self, args: argparse.Namespace, plan: Plan, cluster: Cluster):
        self.a, self.plan, self.cluster = args, plan, cluster
        self.wmax = max(args.workers + ([args.train_workers] if args.train else []))
        self.smax = server_hosts(args)
        hosts = plan.hosts
        self.whosts, self.shosts = hosts[:self.wmax], hosts[self.wmax:]
        self.port = 21000
        # a partition waits behind the credit window on a slow link: the core's 1 s resend
        # timer would push it again (wasted bandwidth); a real network loses nothing here
        self.extra_env = {"BYTEPS_RESEND_TIMEOUT_S": "30",
                          **dict(kv.split("=", 1) for kv in args.env)}
        self.rows: list[dict] = []
        self.train_rows: list[dict] = []
        self.probes: dict = {}
        self.traces: dict = {}
        self.pipelines: dict = {}      # fill, steady rate, drain (benchmarks/cluster/pipeline.py)
        self.last_drops: dict = {}
        self.last_cpu: dict = {}       # process description -> CPU seconds (whole life)
        self.last_mesh: float | None = None    # the latest raw mesh, Gbit/s per link

    def next_port(self, n: int = 1) -> int:
        self.port += n
        return self.port - n

    def run(self, specs: list) -> list[dict]:
        before = self.cluster.drops()
        outcomes = jobs.run_specs(self.plan, specs, self.a.timeout)
        self.last_cpu = {o.what: o.cpu_s for o in outcomes}
        recs = jobs.collect(outcomes)
        after = self.cluster.drops()
        self.last_drops = {k: after[k] - before[k] for k in after}
        return recs

    def probe(self, rate: str) -> None:
        secs = self.a.probe_seconds
        one = self.run(jobs.probe_job([(self.whosts[0], self.whosts[1 % self.wmax])],
                                      self.next_port(), secs)) if self.wmax > 1 else []
        w = max(self.a.workers)
        if self.shosts:                   # every worker link busy both ways, like a PS
            pairs = [(self.whosts[i], self.shosts[i % len(self.shosts)]) for i in range(w)]
        else:
            pairs = [(self.whosts[i], self.whosts[i + 1]) for i in range(0, w - 1, 2)]
        every = self.run(jobs.probe_job(pairs, self.next_port(len(pairs)), secs))
        def per_dir(recs):
            return [r["recv_Bps"] for r in recs if r.get("recv_Bps")]
        p = {"pair_Gbps": min(per_dir(one)) * 8 / 1e9 if per_dir(one) else None,
             "all_Gbps": sum(per_dir(every)) / len(per_dir(every)) * 8 / 1e9
             if per_dir(every) else None, "nominal_Gbps": rate_bps(rate) / 1e9}
        if self.shosts:                   # every worker to every server at once, both ways
            p.update(self.mesh(rate))
        self.probes[rate] = p
        print(f"[{rate}] raw TCP full duplex: one pair {p['pair_Gbps']} Gbit/s per direction; "
              f"{len(pairs)} links at once {p['all_Gbps']} Gbit/s each", flush=True)

    def mesh(self, rate: str) -> dict:
        """The raw TCP worker<->server mesh: every worker host to every server host at
        once, both ways (the PS pattern moved by the kernel alone), and its CPU per GB.
        Measured before and after every row: the links' speed drifts between minutes."""
        w = max(self.a.workers)
        ws, ss = self.whosts[:w], self.shosts[:min(w, len(self.shosts))]
        recs = self.run(jobs.mesh_job(ws, ss, self.next_port(), self.a.probe_seconds))
        mesh = [r for r in recs if r.get("role") == "connect" and r.get("recv_Bps")]
        p = {"mesh_Gbps": min(min(r["recv_Bps"], r["send_Bps"]) for r in mesh) * 8 / 1e9
             if mesh else None}
        for role, side in (("connect", "worker"), ("serve", "server")):   # the CPU floor
            got = [r for r in recs if r.get("role") == role and r.get("moved_bytes")]
            p[f"mesh_{side}_cpu_s_per_GB"] = sum(r["cpu_s"] for r in got) / (
                sum(r["moved_bytes"] for r in got) / 1e9) if got else None
        self.last_mesh = p["mesh_Gbps"]
        print(f"[{rate}] raw TCP worker<->server mesh ({len(ws)}x{len(ss)}): "
              f"{_g(p['mesh_Gbps'])} Gbit/s per worker link, each way; CPU s/GB moved: "
              f"worker {_g(p['mesh_worker_cpu_s_per_GB'])}, server "
              f"{_g(p['mesh_server_cpu_s_per_GB'])}", flush=True)
        return p

    def size_bytes(self, rate: str) -> int:
        mb = self.a.size_mb if rate_bps(rate) >= 5e8 else self.a.slow_size_mb
        return int(mb * 1e6) // 4 * 4

    def bench(self, rate: str, w: int, system: str, key: str) -> list[dict]:
        iters, warmup = self.a.iters, self.a.warmup
        if system == "byteps-nomarks":     # as many steps, timed from the 3rd on
            iters, warmup = iters + max(0, warmup - 2), min(2, warmup)
        argv = [sys.executable, str(HERE / ("bench_gloo.py" if system == "gloo"
                                             else "bench_pushpull.py")),
                str(self.size_bytes(rate)), str(iters), str(warmup)]
        if system != "gloo":
            argv.append("nomarks" if system == "byteps-nomarks" else "marks")
        workers = self.whosts[:w]
        if system == "gloo":
            return self.run(jobs.gloo_job(workers, argv, self.next_port()))
        tdir = self.a.out / "traces" / key
        env = dict(dict(BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=tdir,
                        BYTEPS_TRACE_START_STEP=warmup,
                        BYTEPS_TRACE_END_STEP=warmup + iters - 1), **self.extra_env)
        if system in ("byteps", "byteps-nomarks"):
            servers = self.shosts[:self.a.servers or w]
            specs = jobs.byteps_job(workers, servers, servers[0], argv, self.next_port(), env)
        else:
            specs = jobs.byteps_job(workers, workers, workers[0], argv, self.next_port(), env)
        recs = self.run(specs)
        self.traces[key] = report.trace_summary(tdir)
        return recs

    def server_cpu_per_gb(self, rate: str, w: int) -> float | None:
        """Servers' CPU seconds (whole life: start-up, warm-up and timed iterations) per
        GB they received and sent (each iteration: W pushes in, W results out)."""
        cpu = [v for k, v in self.last_cpu.items() if k.startswith("server") and v is not None]
        if not cpu:
            return None
        moved = 2 * w * self.size_bytes(rate) * (self.a.warmup + self.a.iters)  # every variant
        return sum(cpu) / (moved / 1e9)

    def sweep(self) -> None:
        for rate in self.a.rates:
            self.cluster.shape(rate, self.a.latency_ms, self.a.burst_ms)
            self.probe(rate)
            for w in self.a.workers:
                for rnd in range(1, self.a.rounds + 1):
                    self.one_round(rate, w, rnd)
        if self.a.train:
            self.train()

    def one_round(self, rate: str, w: int, rnd: int) -> None:
        """Every system once at ``rate`` with ``w`` workers; with server hosts the raw mesh
        is measured again after each, and a row's ``vs mesh`` is against the faster of the
        mesh runs just before and just after it (both recorded: one 3 s mesh run now and
        then comes out 10-30 % slow, and a slow reference would flatter the row)."""
        got: dict[str, list] = {}
        extra: dict[str, dict] = {}
        for system in self.a.systems:
            key = f"{system}-{rate}-w{w}" + (f"-r{rnd}" if self.a.rounds > 1 else "")
            t0 = time.monotonic()
            got[system] = self.bench(rate, w, system, key)
            timed = [r for r in got[system] if r.get("server_cpu_s") is not None]
            extra[system] = {
                "round": rnd, "link_drops": self.last_drops,
                "server_cpu_s_per_GB": self.server_cpu_per_gb(rate, w),
                "server_timed_cpu_s_per_GB": sum(r["server_cpu_s"] for r in timed) / (
                    sum(r["server_moved_bytes"] for r in timed) / 1e9) if timed else None}
            print(f"[{rate}] W={w} {system}" + (f" round {rnd}" if self.a.rounds > 1 else "")
                  + f": {report.job_time(got[system]):.3f} s/op ({time.monotonic() - t0:.0f} s, "
                  f"{self.last_drops['dropped']} of {self.last_drops['packets']} packets "
                  f"dropped by the links; server CPU s/GB over the timed iterations "
                  f"{_g(extra[system]['server_timed_cpu_s_per_GB'])})", flush=True)
            ref = None
            if self.shosts:                 # mesh() moves last_mesh: the next row's before
                before, after = self.last_mesh, self.mesh(rate)["mesh_Gbps"]
                ref = max(before or 0, after or 0) or None   # the faster: conservative
                extra[system].update(mesh_before_Gbps=before, mesh_after_Gbps=after,
                                     mesh_Gbps=ref)
            if system != "gloo":
                self.pipelines[key] = pipeline.summary(self.a.out / "traces" / key, ref)
        gloo = report.job_time(got["gloo"]) if "gloo" in got else None
        link = (self.probes[rate].get("all_Gbps") or 0) * 1e9 / 8 or None
        for system, recs in got.items():
            s = (self.a.servers or w) if system not in ("byteps-coloc", "gloo") else w
            mesh = (extra[system].get("mesh_Gbps") or 0) * 1e9 / 8 or None
            self.rows.append(dict(report.make_row(system, rate, w, s, recs, gloo, link, mesh),
                                  **extra[system]))

    def train(self) -> None:
        rate, w = self.a.train_rate, self.a.train_workers
        self.cluster.shape(rate, self.a.latency_ms, self.a.burst_ms)
        script = [sys.executable, str(HERE / "train_mlp.py"), *self.a.train_args.split()]
        workers = self.whosts[:w]
        servers = self.shosts[:self.a.servers or w]
        systems = ["byteps"] + (["byteps-cb"] if self.a.cross_barrier else [])
        for rnd in range(1, self.a.rounds + 1):      # DDP, byteps, DDP, byteps, ...
            first = len(self.train_rows)
            ddp = self.run(jobs.gloo_job(workers, script + ["--backend", "ddp"],
                                         self.next_port()))
            d = dict(report.train_row("ddp-gloo", rate, w, ddp), round=rnd)
            self.train_rows.append(d)
            if self.a.ddp_heap:             # byteps/common/malloc.py's settings, by glibc's env
                heap = self.run(jobs.gloo_job(workers, script + ["--backend", "ddp"],
                                              self.next_port(), DDP_HEAP_ENV))
                self.train_rows.append(dict(report.train_row("ddp-heap", rate, w, heap,
                                                             d["img_sec_total"]), round=rnd))
            for system in systems:
                got = self.run(jobs.byteps_job(workers, servers, servers[0],
                                               script + ["--backend", system],
                                               self.next_port(), self.extra_env))
                self.train_rows.append(dict(report.train_row(system, rate, w, got,
                                                             d["img_sec_total"]), round=rnd))
            print(report.train_table(self.train_rows[first:]), flush=True)


# glibc's environment form of byteps/common/malloc.py's mallopt calls
DDP_HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                "MALLOC_TRIM_THRESHOLD_": str(512 << 20)}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cleanup:
        try:
            gone = cleanup()
        except FileNotFoundError as exc:
            print(f"cleanup: {exc}", file=sys.stderr)
            return 1
        print(f"removed {len(gone)} leftover namespace(s): {' '.join(gone) or '-'}")
        return 0
    wmax = max(a.workers + ([a.train_workers] if a.train else []))
    plan = Plan.new(wmax + server_hosts(a))
    cluster = Cluster(plan)
    atexit.register(cluster.close)
    # SIGINT too: a shell that starts the run in the background without job control hands
    # it down ignored, and Ctrl-C / kill -INT must still tear the cluster down
    old = {sig: signal.signal(sig, lambda signum, _f: sys.exit(128 + signum))
           for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    started = time.time()
    try:
        with cluster:
            if a.tcp_cc:
                run_cmds(plan.tcp_cc_commands(a.tcp_cc))
            machine = {"kernel": platform.release(), "tcp_cc": cluster.tcp_cc()}
            print(f"cluster {plan.prefix}: {plan.nhosts} hosts, {os.cpu_count()} CPU cores, "
                  f"load average {os.getloadavg()[0]:.1f} (other work on this machine skews "
                  f"the numbers), kernel {machine['kernel']}, TCP {machine['tcp_cc']}",
                  flush=True)
            runner = Runner(a, plan, cluster)
            runner.sweep()
    except NetnsError as exc:
        print(f"benchmarks.cluster: {exc}", file=sys.stderr)
        return 2
    except jobs.JobError as exc:
        print(f"benchmarks.cluster: a job failed: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.close()
        atexit.unregister(cluster.close)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print()
    print(report.table(runner.rows, runner.probes))
    print(report.train_table(runner.train_rows))
    print(report.trace_table(runner.traces))
    print(pipeline.table(runner.pipelines))
    doc = {"started": started, "seconds": time.time() - started, "cpu_count": os.cpu_count(),
           **machine,
           "loadavg_at_end": os.getloadavg(),
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "probes": runner.probes, "rows": runner.rows, "train": runner.train_rows,
           "traces": runner.traces, "pipeline": runner.pipelines}
    out = fresh(a.out / "results.json")
    report.write_json(out, doc)
    png = report.plot(runner.rows, fresh(a.out / "time_vs_workers.png")) if runner.rows \
        else None
    print(f"wrote {out}" + (f" and {png}" if png else " (no plot: " + (
        "matplotlib is missing)" if runner.rows else "no push_pull rows)")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

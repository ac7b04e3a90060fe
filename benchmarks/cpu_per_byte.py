"""CPU seconds per GB moved: byteps worker and server, gloo, and the raw TCP mesh, one run.

    flock /tmp/bench.lock .venv/bin/python benchmarks/cpu_per_byte.py [--mb 100] [--iters 20]
        [--tag after] [--out benchmarks/results/YYYYMMDD-cpu-per-byte]

Loopback, 2 workers (two emulated hosts) + 2 servers, one tensor of ``--mb`` MB, no variable
set.  Every process's CPU is read per thread from ``/proc/<pid>/task/<tid>/schedstat``
(nanoseconds on a CPU) and ``stat`` (user/system split) before and after each timed window,
between two barriers, so start-up is not counted.  byteps has two windows in one job: the
first steps (``--iters`` steps after ``--warm``: autotune is still searching, trying
partition sizes) and the steady state (``--iters`` steps once autotune is done on every
rank; at most ``--settle`` steps are taken in between for it to finish).  CPU seconds,
not wall time, are the measure: the machine may be shared.  "Moved" is what a process sent
plus what it received: a worker pushes and pulls the tensor (2 x size per push_pull), a
server receives and returns its share of every worker's push, a gloo rank sends and
receives 4 (w - 1) / w x size per all_reduce (ring), a raw mesh process its bytes each way.

Rows: byteps as users run it on one machine (payloads through shared memory,
BYTEPS_ENABLE_IPC=1, the default), byteps over TCP (BYTEPS_ENABLE_IPC=0: what crosses hosts),
torch.distributed gloo all_reduce, and the raw TCP mesh (each worker process sends to and
receives from each server process at once, 1 MB ``send``/``recv_into``: the kernel alone,
the floor).  Writes a table (``.txt``), JSON and a PNG into the output folder.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

# per-thread CPU of a process: {tid: (comm, on-cpu ns, user ticks, system ticks)}
PROBE = r'''
import os
TICK = os.sysconf("SC_CLK_TCK")
def threads(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            st = open(f"/proc/{pid}/task/{tid}/stat").read()
            ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except OSError:
            continue
        comm = "main" if tid == str(pid) else st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[tid] = (comm, ns, int(f[11]), int(f[12]))
    return out
def delta(a, b):
    """{comm: [cpu s, user s, sys s]} between two snapshots (threads named alike add up)."""
    res = {}
    for tid, (comm, ns, ut, stt) in b.items():
        _, ns0, ut0, st0 = a.get(tid, (comm, 0, 0, 0))
        r = res.setdefault(comm, [0.0, 0.0, 0.0])
        r[0] += (ns - ns0) / 1e9
        r[1] += (ut - ut0) / TICK
        r[2] += (stt - st0) / TICK
    return res
'''

WORKER = PROBE + r'''
import json, sys, time
import numpy as np
import byteps.numpy as bps
from byteps.core import api, state
nbytes, iters, warm, settle = (int(a) for a in sys.argv[1:5])
out = sys.argv[5]
bps.init()
st = state.current()
servers = [s["pid"] for s in st.engine.server_info]
x = np.ones(nbytes // 4, np.float32)
def step():
    api.push_pull(x, "cpb", out=x, average=True)
    bps.step_done()
def window(n):
    """CPU of this rank (and, on rank 0, of the servers) over ``n`` steps between barriers."""
    bps.barrier()
    me0, srv0 = threads(os.getpid()), [threads(p) for p in servers]
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wall = time.perf_counter() - t0
    bps.barrier()
    w = {"wall_s": wall, "threads": delta(me0, threads(os.getpid())), "moved": 2 * nbytes * n,
         "steps": n}
    if bps.rank() == 0:
        w["servers"] = [delta(a, threads(p)) for a, p in zip(srv0, servers)]
    return w
def tuned():
    tu = st.tuner
    return tu is None or tu.state == "done"
for _ in range(warm):
    step()
first = window(iters)                      # the first steps: autotune still searching
extra = 0                                  # then until autotune is done on every rank
while extra < settle and api.push_pull(np.array([0.0 if tuned() else 1.0]), "cpb.tuning",
                                       average=False)[0] > 0:
    step()
    extra += 1
res = window(iters)                        # the steady state
res.update(rank=bps.rank(), first=first, settle_steps=extra, tuned=tuned(),
           partition_bytes=st.cfg.partition_bytes, credit_bytes=st.cfg.credit_bytes)
json.dump(res, open(f"{out}.{bps.rank()}", "w"))
'''

GLOO = PROBE + r'''
import json, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
nbytes, iters, warm, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
x = torch.ones(nbytes // 4)
for _ in range(warm):
    dist.all_reduce(x)
dist.barrier()
me0 = threads(os.getpid())
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(x)
wall = time.perf_counter() - t0
dist.barrier()
w = dist.get_world_size()
json.dump({"rank": dist.get_rank(), "wall_s": wall, "threads": delta(me0, threads(os.getpid())),
           "moved": 4 * (w - 1) / w * nbytes * iters}, open(f"{out}.{dist.get_rank()}", "w"))
dist.destroy_process_group()
'''


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    e.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return e


def total(threads: dict) -> list:
    return [sum(v[i] for v in threads.values()) for i in range(3)]


def _cpu(ranks: list, window: str | None) -> dict:
    """CPU per GB of the workers and servers over one measured window of every rank
    (``window``: "first", or None for the steady state)."""
    ws = [r[window] if window else r for r in ranks]
    wcpu = [total(w["threads"]) for w in ws]
    scpu = [total(s) for s in ws[0]["servers"]]
    moved = sum(w["moved"] for w in ws)      # the servers move the same bytes in all
    return {"wall_s": max(w["wall_s"] for w in ws) / ws[0]["steps"],
            "worker_s_per_gb": sum(c[0] for c in wcpu) / (moved / 1e9),
            "server_s_per_gb": sum(c[0] for c in scpu) / (moved / 1e9),
            "worker_user_sys": [sum(c[1] for c in wcpu), sum(c[2] for c in wcpu)],
            "server_user_sys": [sum(c[1] for c in scpu), sum(c[2] for c in scpu)],
            "worker_threads": [w["threads"] for w in ws], "server_threads": ws[0]["servers"],
            "moved_bytes": moved}


def run_byteps(nbytes: int, iters: int, warm: int, settle: int, tmp: Path, ipc: bool,
               partition: int = 0) -> dict:
    """The steady state (``iters`` steps once autotune is done on every rank), with the
    first ``iters`` steps after ``warm`` (autotune still searching) under ``first``."""
    script, out = tmp / "bps_worker.py", tmp / f"bps_{int(ipc)}_{partition}"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "-n", "2", "--hosts", "2",
           "-s", "2", sys.executable, str(script), str(nbytes), str(iters), str(warm),
           str(settle), str(out)]
    extra = {"BYTEPS_PARTITION_BYTES": str(partition)} if partition else {}
    subprocess.run(cmd, env=env(BYTEPS_ENABLE_IPC="1" if ipc else "0", **extra), check=True,
                   timeout=900)
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    res = _cpu(ranks, None)
    res.update(first=_cpu(ranks, "first"), settle_steps=ranks[0]["settle_steps"],
               tuned=all(r["tuned"] for r in ranks),
               partition_bytes=ranks[0]["partition_bytes"],
               credit_bytes=ranks[0]["credit_bytes"])
    return res


def run_gloo(nbytes: int, iters: int, warm: int, tmp: Path) -> dict:
    script, out = tmp / "gloo_worker.py", tmp / "gloo"
    script.write_text(GLOO)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
    s.close()
    procs = [subprocess.Popen([sys.executable, str(script), str(nbytes), str(iters), str(warm),
                               str(out)],
                              env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                                      WORLD_SIZE="2"))
             for r in (0, 1)]
    for p in procs:
        if p.wait(timeout=900) != 0:
            raise RuntimeError("gloo benchmark failed")
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    cpu = [total(r["threads"]) for r in ranks]
    moved = sum(r["moved"] for r in ranks)
    return {"wall_s": max(r["wall_s"] for r in ranks) / iters,
            "worker_s_per_gb": sum(c[0] for c in cpu) / (moved / 1e9),
            "worker_user_sys": [sum(c[1] for c in cpu), sum(c[2] for c in cpu)],
            "worker_threads": [r["threads"] for r in ranks], "moved_bytes": moved}


# ------------------------------------------------------------------ the raw TCP mesh
CHUNK = 1 << 20


def _mesh_proc(role: str, seconds: float, addrs: list) -> None:
    """One mesh process: ``serve`` accepts one connection per worker on ``addrs[0]`` (a
    listening fd handed down), ``connect`` dials every server; each connection sends and
    receives at once for ``seconds``; prints its bytes and CPU seconds as JSON."""
    if role == "serve":
        lst = socket.socket(fileno=int(addrs[0]))
        conns = [lst.accept()[0] for _ in range(int(addrs[1]))]
    else:
        conns = [socket.create_connection((h, int(p))) for h, p in (a.rsplit(":", 1)
                                                                    for a in addrs)]
    sent, got = [0] * len(conns), [0] * len(conns)

    def pump(i, c):
        buf = memoryview(bytearray(CHUNK))
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sent[i] += c.send(buf)
        c.shutdown(socket.SHUT_WR)

    def drain(i, c):
        buf = bytearray(CHUNK)
        while True:
            n = c.recv_into(buf)
            if not n:
                return
            got[i] += n
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    ths = [threading.Thread(target=f, args=(i, c)) for i, c in enumerate(conns)
           for f in (pump, drain)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"role": role, "moved": sum(sent) + sum(got),
                      "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime}),
          flush=True)


def run_mesh(seconds: float) -> dict:
    lsts = []
    for _ in (0, 1):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        lsts.append(s)
    me = [sys.executable, __file__, "--mesh"]
    procs = [subprocess.Popen(me + ["serve", str(seconds), str(s.fileno()), "2"],
                              pass_fds=(s.fileno(),), stdout=subprocess.PIPE, text=True)
             for s in lsts]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in lsts]
    procs += [subprocess.Popen(me + ["connect", str(seconds)] + addrs, stdout=subprocess.PIPE,
                               text=True) for _ in (0, 1)]
    outs = [json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
            for p in procs]
    for s in lsts:
        s.close()
    res = {}
    for role, name in (("connect", "worker"), ("serve", "server")):
        rs = [o for o in outs if o["role"] == role]
        moved = sum(o["moved"] for o in rs)
        res[f"{name}_s_per_gb"] = sum(o["user"] + o["sys"] for o in rs) / (moved / 1e9)
        res[f"{name}_user_sys"] = [sum(o["user"] for o in rs), sum(o["sys"] for o in rs)]
        res[f"{name}_gb_per_s"] = moved / 1e9 / seconds / len(rs)
    return res


# ------------------------------------------------------------------ report
def busy_cores(fn):
    """Run ``fn``; return (its result, the machine's busy cores meanwhile, from /proc/stat)."""
    def snap():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(f), f[3] + f[4]
    (t0, i0), w0 = snap(), time.monotonic()
    r = fn()
    (t1, i1), w1 = snap(), time.monotonic()
    return r, ((t1 - t0) - (i1 - i0)) / TICK / (w1 - w0)


def top_threads(threads: list, moved: int, n: int = 4) -> str:
    agg: dict = {}
    for th in threads:
        for comm, (cpu, _, _) in th.items():
            agg[comm] = agg.get(comm, 0.0) + cpu
    best = sorted(agg.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{c} {v / (moved / 1e9):.2f}" for c, v in best)


def table(res: dict) -> str:
    mesh, gloo = res["mesh"], res.get("gloo")     # no gloo row with --only-tcp
    gw = gloo["worker_s_per_gb"] if gloo else float("nan")
    lines = [f"CPU s per GB moved (sent + received), loopback 2 workers + 2 servers, "
             f"{res['mb']} MB tensor; byteps: {res['iters']} steps once autotune is done "
             f"(steady), and the {res['iters']} steps after {res['warm']} warm-up steps "
             f"(first, autotune searching); machine load {res['loadavg'][0]:.2f} (1 min) at "
             f"start, busy cores during each row shown",
             f"{'row':<26} {'worker':>7} {'server':>7} {'w/gloo':>7} {'w/mesh':>7} "
             f"{'s/mesh':>7} {'ms/op':>7} {'busy':>5} | {'first w':>7} {'first s':>7} "
             f"{'ms/op':>7} | partition"]
    rows = [("byteps (default, shm)", res.get("byteps_shm")),
            ("byteps (tcp, IPC=0)", res.get("byteps_tcp"))]
    rows += [(f"byteps (tcp, {k.split('_')[-1]} parts)", res[k]) for k in res
             if k.startswith("byteps_tcp_")]
    rows += [("gloo all_reduce", gloo), ("raw TCP mesh (floor)", mesh)]
    nan = float("nan")
    for name, r in rows:
        if r is None:
            continue
        w, s = r["worker_s_per_gb"], r.get("server_s_per_gb")
        line = (f"{name:<26} {w:7.3f} {s if s is not None else nan:7.3f} "
                f"{w / gw:7.2f} {w / mesh['worker_s_per_gb']:7.2f} "
                f"{(s or nan) / mesh['server_s_per_gb']:7.2f} "
                f"{r.get('wall_s', nan) * 1e3:7.1f} {r['busy_cores']:5.2f}")
        f = r.get("first")
        if f:
            line += (f" | {f['worker_s_per_gb']:7.3f} {f['server_s_per_gb']:7.3f} "
                     f"{f['wall_s'] * 1e3:7.1f} | {r['partition_bytes'] >> 10} KB, "
                     f"{r['credit_bytes'] / 2**20:.1f} MB in flight"
                     + ("" if r["tuned"] else f", autotune not done after "
                        f"{r['settle_steps']} more steps"))
        lines.append(line)
    lines.append("per-thread CPU s/GB (largest):")
    for key in [k for k in res if k.startswith("byteps_")]:
        r = res.get(key)
        if r:
            lines.append(f"  {key} worker: {top_threads(r['worker_threads'], r['moved_bytes'])}")
            lines.append(f"  {key} server: {top_threads(r['server_threads'], r['moved_bytes'])}")
    if gloo:
        lines.append(f"  gloo rank: {top_threads(gloo['worker_threads'], gloo['moved_bytes'])}")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names, vals, colors = [], [], []
    keys = [("byteps_shm", "byteps shm"), ("byteps_tcp", "byteps tcp")]
    keys += [(k, "tcp " + k.split("_")[-1]) for k in res if k.startswith("byteps_tcp_")]
    for key, label in keys + [("gloo", "gloo"), ("mesh", "raw TCP mesh")]:
        r = res.get(key)
        if not r:
            continue
        windows = [("", r)] + ([(" first", r["first"])] if r.get("first") else [])
        for tag, w in windows:        # steady state, then the first steps (paler)
            names.append(f"{label}{tag}\nworker")
            vals.append(w["worker_s_per_gb"])
            colors.append("tab:blue" if not tag else "lightsteelblue")
            if w.get("server_s_per_gb") is not None:
                names.append(f"{label}{tag}\nserver")
                vals.append(w["server_s_per_gb"])
                colors.append("tab:orange" if not tag else "navajowhite")
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.bar(range(len(vals)), vals, color=colors)
    ax.set_xticks(range(len(vals)), names, fontsize=7)
    ax.axhline(0.55, ls="--", color="tab:blue", lw=0.8, label="worker target 0.55")
    ax.axhline(0.35, ls="--", color="tab:orange", lw=0.8, label="server target 0.35")
    ax.set_ylabel("CPU s per GB moved")
    ax.set_title(f"CPU per byte, loopback 2 + 2, {res['mb']} MB ({res.get('tag') or 'run'})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--mesh":
        return _mesh_proc(sys.argv[2], float(sys.argv[3]), sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--settle", type=int, default=150,
                    help="at most this many steps between the two windows for autotune to "
                         "finish its search")
    ap.add_argument("--mesh-seconds", type=float, default=3.0)
    ap.add_argument("--tag", default="", help="suffix of the file names (e.g. before, after)")
    ap.add_argument("--no-tcp", action="store_true", help="skip the BYTEPS_ENABLE_IPC=0 row")
    ap.add_argument("--only-tcp", action="store_true",
                    help="only the raw mesh and the TCP rows (A/B runs of a change)")
    ap.add_argument("--partition-kb", type=int, action="append", default=[],
                    help="another TCP row with BYTEPS_PARTITION_BYTES of this many KiB (more "
                         "messages per byte: the per-partition work, as with autotune's "
                         "smaller partitions on slow links); repeatable")
    day = datetime.date.today().strftime("%Y%m%d")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"{day}-cpu-per-byte"))
    args = ap.parse_args()
    nbytes = args.mb << 20
    res = {"mb": args.mb, "iters": args.iters, "warm": args.warm, "tag": args.tag,
           "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res["mesh"], b = busy_cores(lambda: run_mesh(args.mesh_seconds))
        res["mesh"]["busy_cores"] = b
        if not args.only_tcp:
            res["gloo"], b = busy_cores(lambda: run_gloo(nbytes, args.iters, args.warm, tmp))
            res["gloo"]["busy_cores"] = b
        for ipc in (True,) if args.no_tcp else (False,) if args.only_tcp else (True, False):
            key = "byteps_shm" if ipc else "byteps_tcp"
            res[key], b = busy_cores(lambda: run_byteps(nbytes, args.iters, args.warm,
                                                        args.settle, tmp, ipc))
            res[key]["busy_cores"] = b
        for kb in args.partition_kb:
            key = f"byteps_tcp_{kb}KB"
            res[key], b = busy_cores(lambda: run_byteps(nbytes, args.iters, args.warm, args.settle,
                                                        tmp, False, kb << 10))
            res[key]["busy_cores"] = b
    res["loadavg_end"] = os.getloadavg()
    text = table(res)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "cpu_per_byte" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    (out / f"{stem}.txt").write_text(text + "\n")
    plot(res, out / f"{stem}.png")
    print(f"wrote {out / stem}.{{json,txt,png}}")


if __name__ == "__main__":
    main()

"""Seeded faults on the emulated cluster (network namespaces): every run must end, correctly.

    sudo .venv/bin/python benchmarks/chaos_cluster.py [--faults 20] [--seed 1] [--only N]
                                  [--max-freeze 30] [--kinds partition,slow-link,...]
                                  [--shapes plain,elastic] [--out DIR]
                                  [--resume --max-wall 560] [--lanes 2]

``--resume`` runs, in order, the drawn faults that ``--out`` has no record of yet
(``part-*.json``, one per invocation, written after every fault) and stops starting
faults after ``--max-wall`` seconds: a long run is done in chunks (each under the
benchmark lock, others may take it in between), and every chunk rewrites the merged
``chaos.json``, the table (``table.txt``) and ``chaos.png`` from all parts.  The
undisturbed runs are made once and kept (``undisturbed.json``).  ``--lanes N`` runs N
faults at once, each on a cluster (6 namespaces) of its own.

The job of benchmarks/chaos.py (benchmarks/chaos_job.py) as on a real cluster: one
``bpslaunch`` per role per host, configured by ``DMLC_*`` (benchmarks/cluster/jobs.py),
every host a network namespace on one bridge (benchmarks/cluster/netns.py); nothing
touches the machine's own network or /dev/shm.  Two shapes, drawn with the fault:

* ``plain``: 4 workers on 2 hosts (local size 2, shared-memory local reduction),
  2 servers on 2 more hosts, the scheduler with the first server; every bpslaunch with
  ``--restart-scheduler``;
* ``elastic``: 4 workers on 4 hosts with ``BYTEPS_MIN_WORKERS=2``, 2 servers with
  ``BYTEPS_SERVER_REPLICAS=1`` on 2 more hosts, the scheduler with the first server.

The faults: those of benchmarks/chaos.py (SIGKILL of a role, SIGSTOP of a worker or
server for 1 to ``--max-freeze`` s, a burst of 2-200 SIGINT/SIGTERM 0.5 ms apart to a
worker host's bpslaunch, rank 0 raising mid-step), and:

* ``partition``: one host's link down (its bridge port) for 1 to ``--max-freeze`` s, then up;
* ``slow-link``: one host's link shaped to 1/50 of 1 Gbit/s (``tc tbf`` 20mbit, both
  directions) for 1 to ``--max-freeze`` s;
* ``full-shm``: the first worker host's bpslaunch runs in its own mount namespace with
  a 1 MiB tmpfs on /dev/shm, full before the job starts.

Outcomes, leftovers and the promise as in benchmarks/chaos.py: **survived** (the
scheduler ended normally and every rank that finished holds a one-process run's
parameters; the plain shape needs all 4 ranks, the elastic one at least 2; an elastic
server's death with its 4 workers kept: bit for bit an undisturbed run's), **right
error** (every process ended within the bound and a bpslaunch's last line names the
fault), **wrong error**, **hang**, **wrong result**; leftovers are processes of the job
and /dev/shm files named after it.  Needs root (namespaces, tc, mount).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos  # noqa: E402
from chaos_job import reference  # noqa: E402

from benchmarks.cluster import netns  # noqa: E402
from benchmarks.cluster.jobs import Spec, base_env, byteps_job  # noqa: E402

KINDS = chaos.KINDS + ["partition", "slow-link", "full-shm"]
SLOW = "20mbit"                 # 1/50 of 1 Gbit/s
SHM_KB = 1024
SLOW_S = 35.0               # a run longer than this (plus the fault's duration) keeps its logs
BOUND_S = 90.0              # a run still going after this (plus a freeze or a partition): a hang
PORT = 9123
BUG_NAMES = ("NameError", "AttributeError", "TypeError", "KeyError", "IndexError",
             "UnboundLocalError", "AssertionError", "ZeroDivisionError", "RecursionError")
STEPS = 300                 # about 7 s of training after a start-up of 1-3 s


def role_pids(job: str, role: str) -> list[int]:
    """The job's processes of ``role`` that are not a bpslaunch (its children)."""
    out = []
    for pid in chaos.job_pids(job, role):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"byteps.launcher" not in cmd:
            out.append(pid)
    return out


def specs_for(plan: netns.Plan, shape: str, job: str, out: Path, extra: dict) -> list[Spec]:
    h = plan.hosts
    work = [sys.executable, str(ROOT / "benchmarks" / "chaos_job.py"), str(out),
            str(STEPS)]
    env = dict(BYTEPS_HEARTBEAT_INTERVAL="0.5", BYTEPS_HEARTBEAT_TIMEOUT="5",
               BYTEPS_STARTUP_TIMEOUT="20", **extra)
    if shape == "plain":
        specs = byteps_job(h[0:2], h[2:4], h[2], work, PORT, dict(env, BYTEPS_LOCAL_SIZE="2"))
    else:
        specs = byteps_job(h[0:4], h[4:6], h[4], work, PORT, dict(
            env, BYTEPS_MIN_WORKERS="2", BYTEPS_ELASTIC_TIMEOUT="10",
            BYTEPS_SERVER_REPLICAS="1"))
    for s in specs:                 # every role's bpslaunch: a restartable scheduler
        s.argv[3:3] = ["--restart-scheduler"]
    for s in specs:
        s.env["BYTEPS_JOB_ID"] = job
        s.env["BYTEPS_LOG_LEVEL"] = "WARNING"
    return specs


def command(plan: netns.Plan, spec: Spec, full_shm: bool) -> list[str]:
    argv = spec.command(plan)
    if not full_shm:
        return argv
    # `ip netns exec` runs the command in a mount namespace of its own (mounts do not
    # propagate back): a small full tmpfs on /dev/shm for this host's bpslaunch only
    fill = (f"mount -t tmpfs -o size={SHM_KB}k chaos-shm /dev/shm && "
            f"(head -c {SHM_KB}k /dev/zero > /dev/shm/full || true) && exec \"$@\"")
    return argv[:4] + ["sh", "-c", fill, "sh"] + argv[4:]


def _link(plan: netns.Plan, host, what: str) -> None:
    sw = plan.switch
    if what in ("down", "up"):
        cmds = [["ip", "-n", sw, "link", "set", host.port, what]]
    elif what == "slow":
        cmds = [["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                 *netns.tbf_args(SLOW)] for ns, dev in ((host.ns, host.dev), (sw, host.port))]
    else:
        cmds = [["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"]
                for ns, dev in ((host.ns, host.dev), (sw, host.port))]
    netns.run_cmds(cmds, check=False)


def run_one(plan: netns.Plan, spec: dict) -> dict:
    job = f"chaosc-{os.getpid()}-{spec['n']}"
    out = Path(tempfile.mkdtemp(prefix="chaosc-"))
    shape, kind = spec["shape"], spec["kind"]
    extra = {"CHAOS_RAISE_AT": str(spec["raise_at"] * STEPS // chaos.STEPS)} \
        if kind == "raise" else {}
    specs = specs_for(plan, shape, job, out, extra)
    used = sorted({s.host.index for s in specs})
    logs, procs = [], []
    t0 = time.monotonic()
    for i, s in enumerate(specs):
        f = tempfile.TemporaryFile("w+")    # noqa: SIM115 (closed below)
        logs.append(f)
        procs.append(subprocess.Popen(command(plan, s, kind == "full-shm" and i == 3),
                                      stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                      start_new_session=True))
    bound = BOUND_S + (spec["freeze_s"] if kind in ("freeze-worker", "freeze-server",
                                                     "partition", "slow-link") else 0)
    target, applied = None, False
    at = 2 * spec["at_s"]       # 0.4-10 s: start-up, formation, training (a longer job)
    while time.monotonic() - t0 < at and any(p.poll() is None for p in procs):
        time.sleep(0.01)
    workers = [p for s, p in zip(specs, procs) if s.env["DMLC_ROLE"] == "worker"]
    if kind in ("partition", "slow-link"):
        host = plan.hosts[used[int(spec["pick"] * len(used))]]
        target = host.ip
        _link(plan, host, "down" if kind == "partition" else "slow")
        end = time.monotonic() + spec["freeze_s"]
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        _link(plan, host, "up" if kind == "partition" else "unshape")
        applied = True
    elif kind == "burst":
        victim = workers[int(spec["pick"] * len(workers))]
        target = victim.pid
        for i in range(spec["burst"]):
            try:
                os.kill(victim.pid, (signal.SIGINT, signal.SIGTERM)[
                    i % 2 if spec["pick"] < .5 else 1])
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        applied = True
    elif kind.startswith(("kill", "freeze")):
        target, applied = chaos.strike(spec, lambda: role_pids(job, kind.split("-")[1]),
                                       lambda: any(p.poll() is None for p in procs), t0 + at + 20)
    else:
        applied = True                      # raise, full-shm: set up at the start
    hung = False
    while any(p.poll() is None for p in procs):
        if time.monotonic() - t0 > bound:
            hung = True
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait(10)
            break
        time.sleep(0.05)
    took = time.monotonic() - t0
    texts = []
    for f in logs:
        f.seek(0)
        texts.append(f.read())
        f.close()
    time.sleep(0.5)
    left = chaos.job_pids(job)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shm = [n for n in os.listdir("/dev/shm") if job in n]
    for n in shm:
        try:
            os.unlink(f"/dev/shm/{n}")
        except OSError:
            pass
    lasts = [(t.strip().splitlines() or [""])[-1] for t in texts]
    codes = [p.returncode for p in procs]
    outcome = classify(spec, codes, hung, lasts, out, target, specs)
    got = [json.loads(f.read_text()) for f in out.glob("rank*.json")]
    ws = {json.dumps(g["w"]) for g in got}
    shutil.rmtree(out, ignore_errors=True)
    return dict(spec, job=job, rcs=codes, took_s=round(took, 1), target=target,
                w=json.loads(ws.pop()) if len(ws) == 1 else None,   # (every rank's, if equal)
                sizes=sorted({g["size"] for g in got}),
                applied=applied, outcome=outcome, last=" | ".join(lasts)[:600],
                leftover_pids=left, leftover_shm=shm,
                stderr_tail="\n---\n".join(t[-1200:] for t in texts)
                if outcome in ("wrong error", "hang", "wrong result")
                or took > SLOW_S + (bound - BOUND_S) else "")    # (a slow end: why)


def classify(spec, codes, hung, lasts, out: Path, target, specs) -> str:
    if hung:
        return "hang"
    sched = next(c for s, c in zip(specs, codes) if s.env["DMLC_ROLE"] == "scheduler")
    got = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
    need = 4 if spec["shape"] == "plain" else 2
    # (a server killed after the workers finished: training completed, the job survived)
    if sched == 0 and (spec["shape"] == "elastic" or all(
            c == 0 for s, c in zip(specs, codes) if s.env["DMLC_ROLE"] != "server")):
        ref = reference(STEPS)
        ok = len(got) >= need and all(
            np.allclose(np.array(g["w"], np.float32), ref, rtol=1e-4, atol=1e-5) for g in got)
        return "survived" if ok else "wrong result"
    text = "\n".join(lasts)
    if any(f"{e}:" in text for e in BUG_NAMES):
        return "wrong error"        # a bug in byteps is never the fault's cause
    kind = spec["kind"]
    if kind == "burst":
        right = any(w in text for w in ("interrupted", "SIGINT", "SIGTERM", f"pid {target}"))
    elif kind == "raise":
        right = "ChaosError" in text
    elif kind == "full-shm":
        right = "/dev/shm" in text or "BYTEPS_SHM_DIR" in text
    elif kind in ("partition", "slow-link"):
        right = str(target) in text or any(w in text for w in (
            "presumed dead", "unreachable", "heartbeat", "did not come back"))
    else:
        # the killed or frozen process by its pid, its signal, or (dead before it registered:
        # no pid known to the scheduler) the registrations missing for its role.  A
        # scheduler is restarted (--restart-scheduler): the job must survive its death
        role = kind.split("-")[1]
        right = kind != "kill-scheduler" and (
            f"pid {target}" in text or "SIGKILL" in text
            or (f"{role}s registered" in text or f"local {role}s registered" in text))
        if kind.startswith("freeze"):
            right = right or "heartbeat" in text or "presumed dead" in text
    return "right error" if right else "wrong error"


def _parts(out: Path) -> list[dict]:
    """The runs recorded in ``out`` by every invocation (``part-*.json``), by fault index."""
    runs = {}
    for f in sorted(out.glob("part-*.json")):
        for r in json.loads(f.read_text())["runs"]:
            runs[r["n"]] = r
    return [runs[n] for n in sorted(runs)]


def merge(out: Path, seed: int, drawn: int) -> list[dict]:
    """Rewrite ``out``'s chaos.json, table.txt and chaos.png from all its parts."""
    runs = _parts(out)
    parts = [json.loads(f.read_text()) for f in sorted(out.glob("part-*.json"))]
    und = out / "undisturbed.json"
    (out / "chaos.json").write_text(json.dumps(
        {"seed": seed, "drawn": drawn, "done": len(runs),
         "commands": [p["command"] for p in parts],
         "commits": sorted({p.get("commit", "?") for p in parts}),
         "wall_s": sum(p["wall_s"] for p in parts),
         "loadavg_per_run": [r.get("load") for r in runs],
         "undisturbed": json.loads(und.read_text()) if und.exists() else None,
         "runs": runs}, indent=1))
    text = chaos.table(runs, KINDS)
    loads = [r["load"] for r in runs if r.get("load") is not None]
    if loads:
        text += (f"\nload average (1 min) at the end of each run: min {min(loads):.1f}, "
                 f"median {sorted(loads)[len(loads) // 2]:.1f}, max {max(loads):.1f}")
    (out / "table.txt").write_text(text + "\n")
    if runs:
        chaos.plot(runs, out / "chaos.png", KINDS)
    return runs


def _commit() -> str:
    """The code's commit (a copy of the tree without .git: its COMMIT file)."""
    if (ROOT / "COMMIT").exists():
        return (ROOT / "COMMIT").read_text().strip()
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _undisturbed(plan: netns.Plan, out: Path, specs: list[dict], shapes: tuple) -> dict:
    """An undisturbed run of each shape (kept in ``out``): a server's death with replicas
    must end with its parameters; the largest difference of every survivor is recorded."""
    f = out / "undisturbed.json"
    und = json.loads(f.read_text()) if f.exists() else {}
    for i, sh in enumerate(shapes):
        if sh not in und:
            r = run_one(plan, dict(specs[0], shape=sh, kind="none", n=-1 - i))
            if r["outcome"] != "survived" or r["w"] is None:
                raise SystemExit(f"the undisturbed {sh} run did not end with one result: "
                                 f"{r['outcome']}, {r['last'][:300]}\n{r['stderr_tail']}")
            und[sh] = r
            f.write_text(json.dumps(und, indent=1))
    return und


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    chaos.add_plan_args(ap, faults=20, known=KINDS)
    ap.add_argument("--resume", action="store_true",
                    help="run only the drawn faults that --out has no record of yet")
    ap.add_argument("--max-wall", type=float, default=None, metavar="S",
                    help="start no fault after S seconds (a chunk of a long run: --resume "
                         "goes on from there)")
    ap.add_argument("--lanes", type=int, default=1,
                    help="faults run at once, each on a cluster of its own (namespaces)")
    a = ap.parse_args(argv)
    specs = chaos.draw_plan(ap, a, KINDS)
    out = Path(a.out or ROOT / "benchmarks" / "results" /
               f"{datetime.date.today():%Y%m%d}-chaos-cluster-{len(specs)}faults-seed{a.seed}")
    out.mkdir(parents=True, exist_ok=True)
    if a.resume:
        done = {r["n"] for r in _parts(out)}
        specs = [s for s in specs if s["n"] not in done]
        if not specs:
            print(f"{out}: all {a.faults} faults done")
            merge(out, a.seed, a.faults)
            return 0
    else:
        for f in [*out.glob("part-*.json"), out / "undisturbed.json"]:
            f.unlink(missing_ok=True)
    part = out / f"part-{len(list(out.glob('part-*.json'))):03d}.json"
    runs: list[dict] = []
    t0 = time.monotonic()
    cmd = " ".join(["benchmarks/chaos_cluster.py", *(argv if argv is not None else sys.argv[1:])])
    commit = _commit()

    def write() -> None:
        part.write_text(json.dumps({"command": cmd, "commit": commit, "seed": a.seed,
                                    "wall_s": round(time.monotonic() - t0), "runs": runs},
                                   indent=1))
    todo = iter(specs)
    guard = threading.Lock()

    def lane(plan: netns.Plan, undisturbed: dict) -> None:
        while True:
            with guard:
                if a.max_wall is not None and time.monotonic() - t0 >= a.max_wall:
                    return
                s = next(todo, None)
            if s is None:
                return
            r = run_one(plan, s)
            u = undisturbed.get(r["shape"], {}).get("w")
            if r["outcome"] == "survived" and r["w"] and u:
                r["diff_undisturbed"] = float(
                    np.abs(np.subtract(r["w"], u, dtype=np.float32)).max())
                # one server's death with replicas and no worker lost: bit for bit the
                # undisturbed run (the servers sum in a fixed order: byteps/server/tree.py)
                if r["kind"] == "kill-server" and r["shape"] == "elastic" and \
                        r["sizes"] == [4] and r["diff_undisturbed"] != 0.0:
                    r["outcome"] = "wrong result"   # not an undisturbed run's parameters
            r["load"] = round(os.getloadavg()[0], 1)
            with guard:
                runs.append(r)
                runs.sort(key=lambda x: x["n"])
                print(f"#{r['n']:3d} {r['shape']:7s} {r['kind']:14s} at {r['at_s']:4.1f} s: "
                      f"{r['outcome']:12s} rcs={r['rcs']} {r['took_s']:5.1f} s  "
                      f"{r['last'][:150]}", flush=True)
                write()
    with contextlib.ExitStack() as stack:
        # --lanes clusters of 6 namespaces each, one fault at a time on each
        plans = [stack.enter_context(netns.Cluster(netns.Plan.new(6))).plan
                 for _ in range(a.lanes)]
        undisturbed = _undisturbed(plans[0], out, specs, tuple(a.shapes.split(",")))
        threads = [threading.Thread(target=lane, args=(pl, undisturbed), daemon=True)
                   for pl in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if len(runs) < len(specs):
        print(f"--max-wall {a.max_wall:g}: stopped after {len(runs)} of {len(specs)} faults "
              f"(--resume goes on)")
    write()
    print(chaos.table(runs, KINDS))
    every = merge(out, a.seed, a.faults)
    load = os.getloadavg()
    print(f"wrote {out / 'chaos.json'}: {len(every)} of {a.faults} faults done (load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    bad = [r for r in runs if r["outcome"] in ("hang", "wrong result")
           or r["leftover_pids"] or r["leftover_shm"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

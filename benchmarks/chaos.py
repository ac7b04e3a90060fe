"""Seeded fault injection on small byteps jobs: every run must end, correctly.

    .venv/bin/python benchmarks/chaos.py [--faults 30] [--seed 1] [--max-freeze 30]
                                         [--kinds kill-worker,freeze-server,...]
                                         [--shapes plain,elastic] [--only N]
                                         [--out benchmarks/results/chaos-<date>-<n>faults]

Each fault runs one job under ``bpslaunch --standalone`` (benchmarks/chaos_job.py, a
least-squares training whose result does not depend on the number of workers), in one
of two shapes, drawn with the fault:

* ``plain``: 2 workers, 1 server;
* ``elastic``: 3 workers with ``--min-workers 2``, 2 servers with
  ``BYTEPS_SERVER_REPLICAS=1`` (one server's death and worker churn are survived).

The faults, at a random moment from start-up to shutdown:

* ``kill-worker``, ``kill-server``, ``kill-scheduler``: SIGKILL of one process of that role;
* ``freeze-worker``, ``freeze-server``: SIGSTOP for 1 to ``--max-freeze`` s, then SIGCONT;
* ``burst``: 2 to 200 SIGINT/SIGTERM to bpslaunch, 0.5 ms apart;
* ``raise``: rank 0 raises in a random step (a worker that fails mid-step).

Every run is classified:

* **survived**: exit 0 and every rank's parameters equal a one-process run's (rtol 1e-4);
* **right error**: the job ended (non-zero) within the bound and bpslaunch's last line
  names the fault (the killed or frozen process's pid or role, the signal, the error);
* **wrong error**: it ended, but the last line names something else;
* **hang**: bpslaunch still ran after the bound (``60 s`` + the freeze): killed;
* **wrong result**: exit 0 with parameters that differ, or missing: a silent wrong result.

After each run, processes of the job still alive and ``/dev/shm/bps-<job>*`` files are
counted as **leftovers** (and removed).  The promise: 0 hangs, 0 wrong results, 0
leftovers.  A failing run is replayed with the same ``--seed`` (runs are drawn in
order; ``--only N`` runs the N-th alone).  Writes ``chaos.json`` (every run: seed,
shape, fault, moment, outcome, last line) and ``chaos.png`` into ``--out``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos_job import reference

KINDS = ["kill-worker", "kill-server", "kill-scheduler", "freeze-worker", "freeze-server",
         "burst", "raise"]
STEPS = 40
BOUND_S = 60.0


def job_pids(job: str, role: str | None = None) -> list[int]:
    """Live processes of the job (by BYTEPS_JOB_ID in their environment), of one role."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"BYTEPS_JOB_ID={job}".encode() not in env or state == "Z":
            continue
        if role is None or f"DMLC_ROLE={role}".encode() in env:
            found.append(int(d))
    return sorted(found)


def _env(job: str, shape: str, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1", BYTEPS_JOB_ID=job, BYTEPS_HEARTBEAT_INTERVAL="0.5",
               BYTEPS_HEARTBEAT_TIMEOUT="5", BYTEPS_STARTUP_TIMEOUT="20")
    if shape == "elastic":
        env.update(BYTEPS_SERVER_REPLICAS="1", BYTEPS_ELASTIC_TIMEOUT="10")
    env.update(extra)
    return env


def draw(rnd: random.Random, kinds: list[str], max_freeze: float,
         shapes: tuple = ("plain", "elastic")) -> dict:
    kind = rnd.choice(kinds)
    return {"shape": rnd.choice(list(shapes)), "kind": kind,
            "at_s": round(rnd.uniform(0.2, 5.0), 2),
            "freeze_s": round(rnd.uniform(1.0, max_freeze), 1),
            "burst": rnd.randint(2, 200), "raise_at": rnd.randint(0, STEPS - 1),
            "pick": rnd.random()}


def strike(spec: dict, pids, running, until: float) -> tuple[int | None, bool]:
    """A kill-* or freeze-* fault: wait for a process (``pids()``, until ``until``), pick
    one with ``spec["pick"]``, SIGKILL it or SIGSTOP it for ``spec["freeze_s"]`` seconds
    (while ``running()``) and SIGCONT it.  Returns (its pid or None, applied)."""
    target = None
    while running() and time.monotonic() < until:
        found = pids()
        if found:
            target = found[int(spec["pick"] * len(found))]
            break
        time.sleep(0.05)
    if target is None:
        return None, False
    try:
        if spec["kind"].startswith("kill"):
            os.kill(target, signal.SIGKILL)
        else:
            os.kill(target, signal.SIGSTOP)
            end = time.monotonic() + spec["freeze_s"]
            while time.monotonic() < end and running():
                time.sleep(0.05)
            os.kill(target, signal.SIGCONT)
    except ProcessLookupError:
        return target, False
    return target, True


def run_one(spec: dict) -> dict:
    """Run one job with the fault ``spec``; classify how it ended."""
    job = f"chaos-{secrets.token_hex(4)}"
    out = Path(tempfile.mkdtemp(prefix="chaos-"))
    shape, kind = spec["shape"], spec["kind"]
    args = ["-np", "2", "--num-servers", "1"] if shape == "plain" else \
        ["-np", "3", "--hosts", "3", "--num-servers", "2", "--min-workers", "2"]
    if shape == "plain":
        args += ["--hosts", "2"]
    extra = {"CHAOS_RAISE_AT": str(spec["raise_at"])} if kind == "raise" else {}
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", *args,
           "--grace-period", "3", sys.executable, str(ROOT / "benchmarks" / "chaos_job.py"),
           str(out), str(STEPS)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=_env(job, shape, extra), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    target, applied = None, False
    bound = BOUND_S + (spec["freeze_s"] if kind.startswith("freeze") else 0)
    while time.monotonic() - t0 < spec["at_s"] and p.poll() is None:
        time.sleep(0.01)
    if p.poll() is None and kind == "burst":
        for i in range(spec["burst"]):
            try:
                os.kill(p.pid, (signal.SIGINT, signal.SIGTERM)[i % 2 if spec["pick"] < .5 else 1])
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        applied = True
    elif kind.startswith(("kill", "freeze")):
        target, applied = strike(spec, lambda: job_pids(job, kind.split("-")[1]),
                                 lambda: p.poll() is None, t0 + spec["at_s"] + 15)
    elif kind == "raise":
        applied = True
    hung = False
    try:
        _, err = p.communicate(timeout=max(1.0, bound - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        hung = True
        p.kill()
        _, err = p.communicate()
    took = time.monotonic() - t0
    time.sleep(0.5)
    deadline = time.monotonic() + 3
    while job_pids(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = job_pids(job)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"bps-{job}")]
    for n in shm:
        try:
            os.unlink(f"/dev/shm/{n}")
        except OSError:
            pass
    lines = err.strip().splitlines()
    last = lines[-1] if lines else ""
    outcome = classify(spec, p.returncode, hung, last, out, target, applied)
    shutil.rmtree(out, ignore_errors=True)
    return dict(spec, job=job, rc=p.returncode, took_s=round(took, 1), target=target,
                applied=applied, outcome=outcome, last=last[:400], leftover_pids=left,
                leftover_shm=shm, stderr_tail=err[-1500:] if outcome in
                ("wrong error", "hang", "wrong result") else "")


def classify(spec, rc, hung, last, out: Path, target, applied) -> str:
    if hung:
        return "hang"
    if rc == 0:
        ref = reference(STEPS)
        got = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
        ok = got and all(np.allclose(np.array(g["w"], np.float32), ref, rtol=1e-4, atol=1e-5)
                         for g in got)
        return "survived" if ok else "wrong result"
    kind = spec["kind"]
    if kind == "burst":
        right = rc in (-2, -15) or "job interrupted" in last or "job ended by SIG" in last
    elif kind == "raise":
        right = "ChaosError" in last
    else:
        role = kind.split("-")[1]
        right = (target is not None and f"pid {target}" in last) or role in last
        if kind.startswith("freeze"):
            right = right or "heartbeat" in last or "presumed dead" in last
    return "right error" if right else "wrong error"


def table(runs: list[dict], kinds: list[str] = KINDS) -> str:
    cols = ["survived", "right error", "wrong error", "hang", "wrong result"]
    rows = [f"{'fault':16s} {'runs':>5s} " + " ".join(f"{c:>12s}" for c in cols)
            + f" {'leftovers':>9s}"]
    for kind in kinds + ["all"]:
        rs = [r for r in runs if kind in ("all", r["kind"])]
        if not rs:
            continue
        left = sum(bool(r["leftover_pids"] or r["leftover_shm"]) for r in rs)
        rows.append(f"{kind:16s} {len(rs):5d} "
                    + " ".join(f"{sum(r['outcome'] == c for r in rs):12d}" for c in cols)
                    + f" {left:9d}")
    return "\n".join(rows)


def plot(runs: list[dict], path: Path, kinds: list[str] = KINDS) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cols = ["survived", "right error", "wrong error", "hang", "wrong result"]
    kinds = [k for k in kinds if any(r["kind"] == k for r in runs)]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bottom = np.zeros(len(kinds))
    for c in cols:
        v = np.array([sum(r["kind"] == k and r["outcome"] == c for r in runs) for k in kinds])
        ax.bar(kinds, v, bottom=bottom, label=c)
        bottom += v
    ax.set_ylabel("runs")
    ax.set_title(f"chaos: {len(runs)} faults (seed {runs[0]['seed']})")
    ax.legend(fontsize=7)
    plt.xticks(rotation=20, fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def add_plan_args(ap: argparse.ArgumentParser, faults: int, known: list = KINDS) -> None:
    """The options of a fault plan (also benchmarks/chaos_cluster.py's): how many faults,
    the seed that draws them, their kinds (of ``known``) and job shapes, one alone, the
    output folder."""
    ap.add_argument("--faults", type=int, default=faults)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-freeze", type=float, default=30.0)
    ap.add_argument("--kinds", default=",".join(known))
    ap.add_argument("--shapes", default="plain,elastic")
    ap.add_argument("--only", type=int, default=None, help="run the N-th fault alone (0-based)")
    ap.add_argument("--out", default=None)


def draw_plan(ap: argparse.ArgumentParser, a, known: list = KINDS) -> list[dict]:
    """The faults of :func:`add_plan_args`'s options ``a``: ``--faults`` drawn with
    ``--seed`` (``ap.error`` on a kind not ``known`` or an unknown shape), or only the
    ``--only``-th."""
    kinds = a.kinds.split(",")
    bad = set(kinds) - set(known)
    if bad:
        ap.error(f"unknown fault kind(s) {sorted(bad)}; known: {','.join(known)}")
    shapes = tuple(a.shapes.split(","))
    if set(shapes) - {"plain", "elastic"}:
        ap.error(f"--shapes: plain and/or elastic, not {a.shapes!r}")
    rnd = random.Random(a.seed)
    specs = [dict(draw(rnd, kinds, a.max_freeze, shapes), seed=a.seed, n=i)
             for i in range(a.faults)]
    return specs if a.only is None else [specs[a.only]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_plan_args(ap, faults=30)
    a = ap.parse_args(argv)
    specs = draw_plan(ap, a)
    out = Path(a.out or ROOT / "benchmarks" / "results" /
               f"chaos-{datetime.date.today():%Y%m%d}-{len(specs)}faults-seed{a.seed}")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for s in specs:
        r = run_one(s)
        runs.append(r)
        print(f"#{r['n']:3d} {r['shape']:7s} {r['kind']:14s} at {r['at_s']:4.1f} s: "
              f"{r['outcome']:12s} rc={r['rc']} {r['took_s']:5.1f} s  {r['last'][:110]}",
              flush=True)
    print(table(runs))
    cmd = " ".join(["benchmarks/chaos.py", *(argv if argv is not None else sys.argv[1:])])
    (out / "chaos.json").write_text(json.dumps({"command": cmd, "seed": a.seed, "runs": runs},
                                               indent=1))
    plot(runs, out / "chaos.png")
    print(f"wrote {out / 'chaos.json'}")
    bad = [r for r in runs if r["outcome"] in ("hang", "wrong result")
           or r["leftover_pids"] or r["leftover_shm"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

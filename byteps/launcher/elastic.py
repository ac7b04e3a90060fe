"""bpslaunch --min-workers N --max-workers M: a standalone job whose workers may come and go.

Workers that die (SIGKILL, preemption, an error) are reported and the job goes on: the
scheduler re-forms the group without them (byteps/scheduler/membership.py) as long as
at least ``--min-workers`` remain.  With ``--host-discovery-script`` (horovodrun's
option) the script is run every ``--discovery-interval`` seconds; it prints the current
hosts, one ``host:slots`` (or ``host``, one slot) per line, and bpslaunch starts new
local worker processes while fewer are alive than the slots listed (at most
``--max-workers``).  Each new worker registers with the scheduler and is let in at the
members' next ``state.commit()``.  The job ends when the scheduler ends it: every worker
of the group finished (exit 0), or too few workers for ``BYTEPS_ELASTIC_TIMEOUT``.
"""
from __future__ import annotations

import shlex
import subprocess
import time

from byteps.launcher.supervise import PEER_FAILED_EXIT, _spare_servers, describe_code, say

DISCOVERY_TIMEOUT_S = 10.0


def add_arguments(ap) -> None:
    g = ap.add_argument_group("elastic training (standalone; docs/fault_tolerance.md)")
    g.add_argument("--min-workers", type=int, default=0, metavar="N",
                   help="elastic: the job goes on while at least N workers are alive "
                        "(workers may die and new ones join at a state.commit())")
    g.add_argument("--max-workers", type=int, default=0, metavar="M",
                   help="elastic: at most M workers (default: --num-workers, or the "
                        "discovery script's slots)")
    g.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                   help="elastic: prints the current hosts as host:slots lines (horovodrun's "
                        "format); standalone runs that many local worker processes")
    g.add_argument("--discovery-interval", type=float, default=1.0, metavar="S",
                   help="elastic: run the discovery script every S seconds (default 1)")
    g.add_argument("--elastic-timeout", type=float, default=None, metavar="S",
                   help="elastic: end the job after S seconds below --min-workers "
                        "(BYTEPS_ELASTIC_TIMEOUT; default BYTEPS_STARTUP_TIMEOUT)")


def check(args, ap) -> None:
    """Validate the elastic options (ap.error on a bad combination)."""
    elastic = bool(args.min_workers or args.max_workers or args.host_discovery_script)
    args.elastic = elastic
    if not elastic:
        return
    if args.min_workers < 1:
        ap.error("--max-workers and --host-discovery-script need --min-workers N (N >= 1)")
    if not args.standalone:
        ap.error("--min-workers runs an elastic --standalone job; on a cluster set "
                 "BYTEPS_MIN_WORKERS (and BYTEPS_MAX_WORKERS) for the scheduler and start "
                 "workers with bpslaunch as usual (docs/fault_tolerance.md)")
    if args.max_restarts:
        ap.error("--min-workers and --max-restarts do not combine: an elastic job survives "
                 "lost workers without restarting")
    if args.local_size and args.local_size > 1:
        ap.error("--min-workers: elastic jobs run one worker per emulated host (no "
                 "--local-size)")
    n = args.num_workers or args.hosts or args.min_workers
    args.num_workers = n
    if not args.max_workers:
        args.max_workers = max(n, args.min_workers)
    if args.max_workers < args.min_workers:
        ap.error(f"--max-workers {args.max_workers} is below --min-workers {args.min_workers}")
    if not args.min_workers <= n <= args.max_workers:
        ap.error(f"--num-workers {n} must lie between --min-workers {args.min_workers} and "
                 f"--max-workers {args.max_workers}")
    if args.discovery_interval <= 0 or (args.elastic_timeout is not None
                                        and args.elastic_timeout <= 0):
        ap.error("--discovery-interval and --elastic-timeout must be > 0")


def env(args) -> dict:
    """What the scheduler reads (byteps/scheduler/membership.py)."""
    out = {"BYTEPS_MIN_WORKERS": str(args.min_workers),
           "BYTEPS_MAX_WORKERS": str(args.max_workers)}
    if args.elastic_timeout is not None:
        out["BYTEPS_ELASTIC_TIMEOUT"] = f"{args.elastic_timeout:g}"
    return out


def parse_hosts(text: str) -> int:
    """Total slots of ``host:slots`` lines (``host`` alone: one slot); ValueError if bad."""
    total = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        host, _, slots = line.partition(":")
        if not host or (slots and not slots.strip().isdigit()):
            raise ValueError(f"bad line {line!r} (want host:slots)")
        total += int(slots) if slots else 1
    return total


class Discovery:
    """Runs the host discovery script; remembers its last good answer."""

    def __init__(self, script: str, interval: float):
        self.argv = shlex.split(script)
        self.interval = interval
        self.next = 0.0
        self.slots: int | None = None
        self.warned = ""

    def forget(self) -> None:
        """Run the script again before acting (a worker just died: the old answer counted
        it)."""
        self.slots, self.next = None, 0.0

    def poll(self, now: float) -> int | None:
        if now < self.next:
            return self.slots
        self.next = now + self.interval
        try:
            r = subprocess.run(self.argv, capture_output=True, text=True,
                               timeout=DISCOVERY_TIMEOUT_S, check=False)
            if r.returncode != 0:
                raise ValueError(f"exit code {r.returncode}: {r.stderr.strip()[:200]}")
            self.slots = parse_hosts(r.stdout)
            self.warned = ""
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            text = f"host discovery script {self.argv[0]!r} failed ({exc}); keeping " \
                   f"{self.slots} slot(s)"
            if text != self.warned:
                say(text)
                self.warned = text
        return self.slots


def supervise(job, args, workers: list, services: list, start_worker) -> int:
    """Supervise an elastic standalone job: a worker's death is reported, not fatal; new
    workers are started from the discovery script; the scheduler decides the end."""
    job.workers = workers           # SIGINT reaches new workers too (same list)
    disco = Discovery(args.host_discovery_script, args.discovery_interval) \
        if args.host_discovery_script else None
    order: list = []
    gone: set = set()
    spare = _spare_servers(services)    # BYTEPS_SERVER_REPLICAS=1: one server's death survived
    while True:
        if job.interrupted is not None:
            return job._interrupt(workers)
        job._note_exits(order)
        # (a worker's death is not the job's failure here: only services count for _survive)
        job._survive([p for p in order if p in services], spare)
        for p in order:
            if p in workers and p not in gone:
                gone.add(p)
                code = p.p.returncode
                if disco is not None:
                    disco.forget()      # replace it only if the hosts listed after its death say so
                if code not in (0, PEER_FAILED_EXIT):
                    alive = sum(1 for w in workers if w.p.poll() is None)
                    say(f"{p.what} (pid {p.p.pid}) ended with {describe_code(code)}; the "
                        f"elastic job goes on with {alive} worker(s) (--min-workers "
                        f"{args.min_workers})")
        sched = job.scheduler
        if sched is not None and sched.p.poll() is not None:
            if sched.p.returncode == 0:
                return _finish(job, workers, services)
            return job._fail(sched, order)
        bad = next((s for s in services if s is not sched and s.p.poll() not in (None, 0)
                    and s not in job.survived), None)
        if bad is not None:
            return job._fail(bad, order)
        if disco is not None and not any(w.p.returncode == 0 for w in gone):
            # (once a worker finished, training is ending: no replacements)
            slots = disco.poll(time.monotonic())
            alive = [w for w in workers if w.p.poll() is None]
            want = min(slots or 0, args.max_workers)
            for _ in range(max(0, want - len(alive))):
                w = start_worker()
                workers.append(w)
                say(f"started {w.what} (pid {w.p.pid}): the discovery script lists {slots} "
                    f"slot(s), {len(alive)} worker(s) were alive")
                alive.append(w)
        if job.on_tick is not None:
            job.on_tick()
        time.sleep(0.05)


def _finish(job, workers: list, services: list) -> int:
    """The scheduler ended the job normally: the group's workers finished.  Workers still
    running (started but never let in) are ended with the services."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(w.p.poll() is None for w in workers):
        time.sleep(0.05)
    late = [w for w in workers if w.p.poll() is None]
    if late:
        say(f"{len(late)} worker(s) still running 10 s after the job ended (waiting to "
            f"join, or slow to exit): terminated")
    return job._finish(services)

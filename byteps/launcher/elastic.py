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
    g.add_argument("--min-workers", "--min-np", "--min-num-proc", type=int, default=0,
                   metavar="N",
                   help="elastic: the job goes on while at least N workers are alive "
                        "(workers may die and new ones join at a state.commit())")
    g.add_argument("--max-workers", "--max-np", "--max-num-proc", type=int, default=0,
                   metavar="M",
                   help="elastic: at most M workers (default: --num-workers, or the "
                        "discovery script's slots)")
    g.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                   help="elastic: prints the current hosts as host:slots lines (horovodrun's "
                        "format); standalone runs that many local worker processes")
    g.add_argument("--slots-per-host", type=int, default=1, metavar="N",
                   help="elastic: the slots of a discovered host listed without :slots "
                        "(horovodrun's option; default 1)")
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
    over_ssh = bool(args.host_list or args.hostfile or args.slurm)
    if not (args.standalone or over_ssh):
        ap.error("--min-workers runs an elastic --standalone, -H/--hostfile or --slurm job; "
                 "on Kubernetes print elastic manifests with bpslaunch k8s --min-workers N; "
                 "on another cluster set BYTEPS_MIN_WORKERS (and BYTEPS_MAX_WORKERS) for the "
                 "scheduler and start workers with bpslaunch as usual "
                 "(docs/fault_tolerance.md)")
    if args.slurm and args.host_discovery_script:
        ap.error("--host-discovery-script starts workers on the hosts it lists, but under "
                 "--slurm every worker is a task of the allocation (one bpslaunch each, none "
                 "can start processes on another node); use -H/--hostfile for discovery, or "
                 "--min-workers alone under Slurm (lost tasks are left behind)")
    if args.max_restarts:
        ap.error("--min-workers and --max-restarts do not combine: an elastic job survives "
                 "lost workers without restarting")
    if args.slots_per_host < 1:
        ap.error("--slots-per-host must be >= 1")
    if over_ssh:
        if args.discovery_interval <= 0 or (args.elastic_timeout is not None
                                            and args.elastic_timeout <= 0):
            ap.error("--discovery-interval and --elastic-timeout must be > 0")
        return                  # the worker count comes from the hosts (ssh_env)
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


def ssh_env(args, base: dict, total: int) -> dict:
    """-H/--hostfile with --min-workers: every worker process is a byteps host of its
    own (DMLC_NUM_WORKER = all workers, local size 1: the group re-forms worker by
    worker, which local reduction cannot follow), plus the scheduler's settings.
    Raises ValueError (one line) for counts that do not fit."""
    if not args.max_workers:
        args.max_workers = max(total, args.min_workers)
    if args.max_workers < args.min_workers:
        raise ValueError(f"--max-workers {args.max_workers} is below --min-workers "
                         f"{args.min_workers}")
    if not args.min_workers <= total <= args.max_workers:
        raise ValueError(f"the hosts give {total} worker(s), which must lie between "
                         f"--min-workers {args.min_workers} and --max-workers "
                         f"{args.max_workers}")
    return dict(base, DMLC_NUM_WORKER=str(total), **env(args))


def parse_host_slots(text: str, default: int = 1) -> dict[str, int]:
    """``host:slots`` lines (``host`` alone: ``default`` slots) -> {host: slots}; ValueError
    if bad."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        host, _, slots = line.rpartition(":") if ":" in line else (line, "", str(default))
        if not host or not slots.strip().isdigit():
            raise ValueError(f"bad line {line!r} (want host:slots)")
        out[host] = out.get(host, 0) + int(slots)
    return out


def parse_hosts(text: str) -> int:
    """Total slots of ``host:slots`` lines (``host`` alone: one slot); ValueError if bad."""
    return sum(parse_host_slots(text).values())


def place(hosts: dict[str, int], alive_on: list[str]) -> str | None:
    """The first host (in the script's order) with fewer live workers than slots."""
    for h, slots in hosts.items():
        if alive_on.count(h) < slots:
            return h
    return None


class Discovery:
    """Runs the host discovery script; remembers its last good answer."""

    def __init__(self, script: str, interval: float, default_slots: int = 1):
        self.argv = shlex.split(script)
        self.interval, self.default_slots = interval, default_slots
        self.next = 0.0
        self.slots: int | None = None
        self.hosts: dict[str, int] = {}     # the last good answer, host -> slots
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
            self.hosts = parse_host_slots(r.stdout, self.default_slots)
            self.slots = sum(self.hosts.values())
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
    disco = Discovery(args.host_discovery_script, args.discovery_interval,
                      args.slots_per_host) if args.host_discovery_script else None
    order: list = []
    gone: set = set()
    lost: list = []             # workers that died for their own reason, in order
    spare = _spare_servers(services)    # BYTEPS_SERVER_REPLICAS=1: one server's death survived
    while True:
        if job.interrupted is not None:
            return job._interrupt(workers)
        job._note_exits(order)
        job._maybe_restart_scheduler(services, order)      # (killed: a new one, same address)
        # (a worker's death is not the job's failure here: only services count for _survive)
        job._survive([p for p in order if p in services], spare)
        for p in order:
            if p in workers and p not in gone:
                gone.add(p)
                code = p.p.returncode
                if disco is not None:
                    disco.forget()      # replace it only if the hosts listed after its death say so
                if code not in (0, PEER_FAILED_EXIT):
                    lost.append(p)
                    _tell_scheduler(job, p)
                    alive = sum(1 for w in workers if w.p.poll() is None)
                    say(f"{p.what} (pid {p.p.pid}) ended with {describe_code(code)}; the "
                        f"elastic job goes on with {alive} worker(s) (--min-workers "
                        f"{args.min_workers})")
        sched = job.scheduler
        if sched is None and all(p.p.poll() is not None for p in job.procs):
            # a Slurm task without the scheduler: its servers ended as told, its workers
            # finished or were lost (the group went on without them: not this task's failure)
            bad = next((s for s in services if s.p.returncode != 0 and s not in job.survived),
                       None)
            return job._fail(bad, order) if bad is not None else job._finish(services)
        if sched is not None and sched.p.poll() is not None:
            if sched.p.returncode == 0:
                return _finish(job, workers, services)
            # the root cause: a lost worker (the scheduler's reason follows), never a
            # process told that another one failed
            return job._fail(lost[0] if lost else sched, order)
        bad = next((s for s in services if s is not sched and s.p.poll() is not None
                    and (s.p.returncode != PEER_FAILED_EXIT or sched is None)
                    and s.p.returncode != 0 and s not in job.survived), None)
        if bad is not None:
            return job._fail(bad, order)
        if disco is not None and not any(w.p.returncode == 0 for w in gone):
            # (once a worker finished, training is ending: no replacements)
            slots = disco.poll(time.monotonic())
            alive = [w for w in workers if w.p.poll() is None]
            want = min(slots or 0, args.max_workers)
            for _ in range(max(0, want - len(alive))):
                w = start_worker(disco.hosts, alive)
                if w is None:
                    break
                workers.append(w)
                say(f"started {w.what} (pid {w.p.pid}): the discovery script lists {slots} "
                    f"slot(s), {len(alive)} worker(s) were alive")
                alive.append(w)
        if job.on_tick is not None:
            job.on_tick()
        time.sleep(0.05)


def _tell_scheduler(job, p) -> None:
    """Standalone: the scheduler reads the pids of dead workers from the status folder
    (byteps/scheduler/membership.py LOST_FILE), so that a worker dead before it registered
    is not waited for at formation."""
    if not job.status_dir or not hasattr(p.p, "pid"):
        return
    try:
        with open(f"{job.status_dir}/lost-workers", "a") as f:
            f.write(f"{p.p.pid}\n")
    except OSError:
        pass


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


def supervise_ssh(job, args, services: list, base: dict, hosts: list, cmd: list,
                  python: str, tag: bool) -> int:
    """An elastic job over ssh (-H/--hostfile with --min-workers): as :func:`supervise`;
    a worker the discovery script asks for is started over ssh on the first listed host
    with fewer live workers than its slots (a host of its own to the scheduler: no
    DMLC_WORKER_ID, local size 1)."""
    from byteps.launcher import ssh
    next_rank = [len(job.workers)]

    def start_worker(listed: dict, alive: list):
        host = place(listed, [w.role.host for w in alive])
        if host is None:
            return None
        role = ssh.Role("worker", next_rank[0], host, None, 0)
        next_rank[0] += 1
        env = ssh.role_env(base, role, hosts)
        env.pop("DMLC_WORKER_ID")
        p = ssh.launch(args, job, role, env, cmd, python)
        job.workers.remove(p)                   # supervise() adds it to its list
        p.what = f"worker on {host} (joined later)"
        p.handshake(time.monotonic() + args.ssh_connect_timeout + ssh.STARTUP_S)
        p.pump(tag, args.log_dir)
        return p
    return supervise(job, args, job.workers, services, start_worker)

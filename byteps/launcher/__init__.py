"""bpslaunch: start BytePS roles from DMLC_* variables, or a whole job on one machine.

    bpslaunch -np 4 python train.py          # this machine: 4 workers (local ranks 0..3),
                                             # a scheduler and 1 server
    bpslaunch -np 4 --hosts 2 -s 2 python train.py   # emulate 2 hosts of 2 workers each
    bpslaunch -H localhost:4 python train.py         # local slots start directly, no ssh
    bpslaunch -H gpu1:8,gpu2:8 --server-hosts cpu1,cpu2 python train.py  # over ssh
    DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch --local-size 8 python train.py  # cluster
    bpslaunch k8s --workers 2 --servers 2 --image IMG -- python train.py > job.yaml
                                             # Kubernetes manifests (bpslaunch k8s --help)

Every child runs in its own process group and dies with bpslaunch.  When a
process fails, the job is ended within seconds and the last line names the
root cause: the process that failed for its own reason, with the scheduler's
reason (processes that ended only because of it exit with code 86).
"""
from __future__ import annotations

import argparse
import importlib
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading

from byteps import DIST
from byteps.common import torchrun, variables
from byteps.common.config import NAMES_CHECKED, Config, ConfigError, name_report
from byteps.launcher import dashboard, liveview, lost
from byteps.launcher.report import print_summaries, trace_note
from byteps.launcher.supervise import (  # noqa: F401
    Job, LaunchError, Proc, _child_setup, refuse, say)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_size_from_env(arg: int | None) -> int:
    if arg:
        return arg
    if os.environ.get("BYTEPS_LOCAL_SIZE"):
        return int(os.environ["BYTEPS_LOCAL_SIZE"])
    vis = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if vis and vis not in ("all", "none", "void"):
        return len([d for d in vis.split(",") if d.strip()])
    return 1


def check_command(cmd: list[str], env) -> None:
    """Raise LaunchError (one line) when the program to run does not exist."""
    prog = cmd[0]
    if os.sep in prog:
        if not os.path.exists(prog):
            raise LaunchError(f"{prog}: no such file")
        if os.path.isdir(prog) or not os.access(prog, os.X_OK):
            raise LaunchError(f"{prog}: permission denied (not an executable file)", 126)
    elif shutil.which(prog, path=env.get("PATH", os.defpath)) is None:
        raise LaunchError(f"{prog}: command not found")


def check_config(envs: dict[str, dict]) -> None:
    """Validate the configuration of each role once, before anything starts (raises
    ConfigError), and report unknown or unneeded variable names once for the whole job."""
    for role, env in envs.items():
        Config.from_env(env, role=role, warn_unknown=False)
    unknown, original = name_report(next(iter(envs.values())))
    for text in unknown:
        say(f"warning: {text}")
    if original:
        say(f"note: {', '.join(original)}: variable(s) of the original BytePS or ps-lite that "
            f"this implementation does not need; ignored")
    from byteps.common.metrics import check_env
    note = check_env(next(iter(envs.values())))     # BYTEPS_METRICS_PORT
    if note:
        say(f"warning: {note}")


def _tagging(flag: bool | None, workers: int) -> bool:
    """Prefix worker output with the rank: forced by --tag-output/--no-tag-output, else
    whenever more than one worker writes (a terminal, a pipe or a file alike)."""
    if flag is not None:
        return flag
    return workers > 1


def _divisors(n: int) -> str:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, ds[:-1])) + (" or " if len(ds) > 1 else "") + str(ds[-1])


def layout(num_workers: int, hosts: int, local_size: int,
           elastic: bool = False) -> tuple[int, int]:
    """(worker hosts, workers per host) of a standalone job.  ``-np N`` means what it
    means in Horovod: N worker processes on this machine, one host of local size N (local
    ranks 0..N-1, shared-memory local reduction); ``--hosts H`` emulates H hosts and
    infers the local size N / H, ``--local-size L`` infers the hosts N / L.  Elastic jobs
    run one worker per emulated host.  Raises SystemExit naming the values that work."""
    n, h, loc = num_workers, hosts, local_size
    if elastic:
        return n or h or 1, 1
    if h and loc:
        if n and n != h * loc:
            raise SystemExit(f"bpslaunch: -np {n} is not --hosts {h} x --local-size {loc} "
                             f"= {h * loc}; give -np {h * loc}, or drop --local-size (then "
                             f"it is -np / --hosts)")
        return h, loc
    if h:
        if not n:
            return h, 1
        if n % h:
            raise SystemExit(f"bpslaunch: -np {n} workers do not split evenly over --hosts "
                             f"{h}: --hosts can be {_divisors(n)} (or -np a multiple of {h})")
        return h, n // h
    if loc:
        n = n or loc
        if n % loc:
            raise SystemExit(f"bpslaunch: -np {n} workers do not split evenly into hosts of "
                             f"--local-size {loc}: --local-size can be {_divisors(n)} (or -np "
                             f"a multiple of {loc})")
        return n // loc, loc
    return 1, n or 1


SOLO_UNSET = ("DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
              "BYTEPS_FORCE_DISTRIBUTED")


def standalone(args, cmd: list[str]) -> int:
    hosts, local = layout(args.num_workers, args.hosts, args.local_size,
                          getattr(args, "elastic", False))
    # torch.distributed's env:// rendezvous (MASTER_ADDR/MASTER_PORT): a free port here
    rendezvous = {"addr": "127.0.0.1", "port": free_port()}
    base = dict(os.environ)
    base.update(DMLC_NUM_WORKER=str(hosts), DMLC_NUM_SERVER=str(args.num_servers),
                DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                BYTEPS_JOB_ID=base.get("BYTEPS_JOB_ID") or f"standalone-{secrets.token_hex(4)}",
                BYTEPS_JOB_SECRET=base.get("BYTEPS_JOB_SECRET") or secrets.token_hex(16),
                BYTEPS_FORCE_DISTRIBUTED="1")
    base.pop("DMLC_NODE_HOST", None)
    # -np 1 (no -s, --dashboard, elastic or BYTEPS_FORCE_DISTRIBUTED=1): the worker runs
    # alone, as with Horovod: no scheduler, server or sockets (docs/configuration.md)
    try:
        force = variables.value("BYTEPS_FORCE_DISTRIBUTED")
    except ConfigError:
        force = True                     # (check_config below reports it)
    solo = hosts * local == 1 and not getattr(args, "num_servers_given", True) and not (
        getattr(args, "elastic", False) or getattr(args, "dashboard", None) is not None
        or force)
    for k in SOLO_UNSET if solo else ():
        base.pop(k)
    if getattr(args, "elastic", False):
        from byteps.launcher import elastic
        base.update(elastic.env(args))

    def worker_env(h: int, lr: int) -> dict:
        return dict(torchrun.apply(base, h, lr, local, hosts,
                                   (rendezvous["addr"], rendezvous["port"])),
                    DMLC_ROLE="worker",
                    DMLC_WORKER_ID=str(h), BYTEPS_LOCAL_RANK=str(lr),
                    BYTEPS_LOCAL_SIZE=str(local), BYTEPS_EMULATED_HOST=f"host{h}")
    try:
        check_config({"worker": worker_env(0, 0)} if solo else {
            "scheduler": dict(base, DMLC_ROLE="scheduler"),
            "server": dict(base, DMLC_ROLE="server"), "worker": worker_env(0, 0)})
        check_command(cmd, base)
        args.live = (liveview.mode(getattr(args, "live", None), base), liveview.interval(base))
    except (ConfigError, LaunchError) as exc:
        return refuse(exc)
    tag = _tagging(args.tag_output, hosts * local)
    dashboard.standalone_env(args, base, free_port)    # --dashboard: the port, the URL
    restarts = getattr(args, "max_restarts", 0)
    for attempt in range(restarts + 1):
        if attempt:
            # the same job id and secret; a new scheduler port and a new range of membership
            # epochs (BYTEPS_RESTART_COUNT), so nothing of the failed incarnation is current
            base.update(BYTEPS_RESTART_COUNT=str(attempt),
                        **({} if solo else {"DMLC_PS_ROOT_PORT": str(free_port())}))
            rendezvous["port"] = free_port()
            say(f"restart {attempt} of {restarts} (--max-restarts): starting the job again "
                f"with the same job secret, membership epoch {attempt << 16}+")
        rc, job = _standalone_once(args, cmd, base, hosts, local, worker_env, tag)
        if rc == 0 or job.interrupted is not None or attempt == restarts:
            if rc == 0 and attempt:
                say(f"job finished after {attempt} restart(s)")
            elif rc and restarts:
                say(f"job failed after {attempt} restart(s) (--max-restarts {restarts})")
            return rc
    return rc


def _standalone_once(args, cmd, base, hosts, local, worker_env, tag) -> tuple:
    """Start and supervise one incarnation of a standalone job: (exit code, Job)."""
    summaries = tempfile.mkdtemp(prefix="bpslaunch-summary-")
    base = dict(base)
    base.update({NAMES_CHECKED: "1", "BPSLAUNCH_SUMMARY_DIR": summaries,
                 "BPSLAUNCH_STATUS_DIR": summaries})
    kind, every = args.live
    passed = (NAMES_CHECKED, "BPSLAUNCH_SUMMARY_DIR", "BPSLAUNCH_STATUS_DIR")
    if kind:                    # the workers write their status for the live view
        base["BPSLAUNCH_LIVE_S"] = f"{liveview.worker_period(kind, every):g}"
        passed += ("BPSLAUNCH_LIVE_S",)
    # every child's output goes through us line by line (supervise._pump), so that lines
    # of several processes never interleave mid-line, and the live view on a terminal
    # erases itself before any output
    pipe = ""
    py = sys.executable
    job = Job(status_dir=summaries)
    live = None
    try:
        services = []
        if "DMLC_PS_ROOT_URI" in base:      # (none for one worker alone: SOLO_UNSET)
            job.scheduler = job.start("scheduler", [py, "-m", "byteps.launcher._scheduler"],
                                      dict(base, DMLC_ROLE="scheduler"), tag=pipe)
            services = [job.scheduler]
        for i in range(args.num_servers if services else 0):
            services.append(job.start(f"server {i}", [py, "-m", "byteps.server"],
                                      dict(base, DMLC_ROLE="server"), tag=pipe))
        workers = []
        for h in range(hosts):
            for lr in range(local):
                rank = h * local + lr
                workers.append(job.start(
                    f"worker rank {rank} (host host{h}, local rank {lr})", cmd,
                    dict(worker_env(h, lr), **{k: base[k] for k in passed}),
                    cpus=_numa_cpus(lr, local, base),
                    tag=f"worker {rank}" if tag else pipe))
        # the clean-up after the job needs byteps.transport (numpy, zmq): loaded while the
        # job runs, not after it, where it added ~0.2 s to the end of every job
        threading.Thread(target=importlib.import_module, args=("byteps.common.shm_cleanup",),
                         name="bpslaunch-preload", daemon=True).start()
        if kind:
            live = liveview.LiveView(summaries, len(workers), kind, every)
            job.on_tick = live.tick
        if getattr(args, "elastic", False):    # workers may leave and join (elastic.py)
            from byteps.launcher import elastic

            def start_worker(_hosts=None, _alive=None):     # (every host is this machine)
                h = len(workers)
                env = dict(worker_env(0, 0), BYTEPS_EMULATED_HOST=f"host{h}",
                           **{k: base[k] for k in passed})
                env.pop("DMLC_WORKER_ID")
                return job.start(f"worker (host host{h}, joined later)", cmd, env,
                                 tag=f"worker host{h}" if tag else pipe)
            return elastic.supervise(job, args, workers, services, start_worker), job
        return job.supervise(workers, services), job
    except LaunchError as exc:          # checked above; a race (the file went away) lands here
        job.terminate(grace=1.0)
        say(str(exc))
        return exc.code, job
    finally:
        if live is not None:
            live.close()
        print_summaries(summaries, failed=bool(job.last_words))
        trace_note(base)
        _remove_shm(base, None)
        job.say_last()


def role_mode(args, cmd: list[str]) -> int:
    role = variables.value("DMLC_ROLE")
    local = local_size_from_env(args.local_size) if role == "worker" else 1
    env0 = dict(os.environ, BYTEPS_LOCAL_RANK="0", BYTEPS_LOCAL_SIZE=str(local)) \
        if role == "worker" else dict(os.environ)
    try:
        check_config({role: env0})
        cfg = Config.from_env(role=role, warn_unknown=False)
    except ConfigError as exc:
        return refuse(exc)
    if getattr(args, "restart_scheduler", False):     # (launcher/reschedule.py)
        from byteps.launcher import reschedule
        reschedule.wait_for_restarts()
        if role == "scheduler":
            return reschedule.run_scheduler(dict(os.environ, **{NAMES_CHECKED: "1"}))
    if role in ("scheduler", "server"):
        # this process becomes the role, started by its module's name (the launcher imports
        # no role: docs/architecture.md); the names were checked above
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", f"byteps.{role}"],
                  dict(os.environ, **{NAMES_CHECKED: "1"}))
    if not cmd:
        raise SystemExit("bpslaunch: DMLC_ROLE=worker needs a command to run")
    try:
        check_command(cmd, os.environ)
    except LaunchError as exc:
        say(str(exc))
        return exc.code
    tag = _tagging(args.tag_output, local)
    status = tempfile.mkdtemp(prefix="bpslaunch-status-")
    job = Job(status_dir=status, in_cluster=True)
    workers = []
    job.on_exit = lost.reporter(cfg, workers)     # the scheduler learns of a death at once
    wid = "?" if cfg.worker_id is None else cfg.worker_id
    try:
        for lr in range(local):
            env = dict(torchrun.apply(os.environ, cfg.worker_id, lr, local, cfg.num_worker),
                       BYTEPS_LOCAL_RANK=str(lr), BYTEPS_LOCAL_SIZE=str(local),
                       BPSLAUNCH_STATUS_DIR=status, BPSLAUNCH_SUMMARY_DIR=status,
                       **{NAMES_CHECKED: "1"})
            name = (f"worker {cfg.worker_id * local + lr}" if cfg.worker_id is not None
                    else f"local rank {lr}")
            workers.append(job.start(
                f"worker (DMLC_WORKER_ID={wid}, host {cfg.node_host}, local rank {lr})", cmd,
                env, cpus=_numa_cpus(lr, local, os.environ),
                # several local workers: whole lines through us (tagged unless told not)
                tag=name if tag else ("" if local > 1 else None)))
        return job.supervise(workers, [])
    except LaunchError as exc:
        job.terminate(grace=1.0)
        say(str(exc))
        return exc.code
    finally:
        print_summaries(status, failed=bool(job.last_words))     # (removes the folder)
        trace_note(os.environ)
        shutil.rmtree(status, ignore_errors=True)
        _remove_shm(os.environ, cfg.host_id)
        job.say_last()


def _numa_cpus(local_rank: int, local_size: int, env) -> list[int] | None:
    """Cores of the NUMA node of a local rank when BYTEPS_NUMA_ON (default: >1 node)."""
    from byteps.common.numa import worker_cpus
    setting = variables.value("BYTEPS_NUMA_ON", env)   # None: on with >1 NUMA node
    try:
        return worker_cpus(local_rank, local_size, setting)
    except (OSError, ValueError) as exc:
        say(f"NUMA binding skipped: {exc}")
        return None


def _remove_shm(env, host_id: str | None) -> None:
    """Remove the job's shared-memory files (all hosts, or one host) once its processes ended."""
    from byteps.common.shm_cleanup import host_prefix, job_prefix, remove_prefix, shm_dir
    job = variables.value("BYTEPS_JOB_ID", env)
    prefix = host_prefix(job, host_id) if host_id is not None else job_prefix(job)
    gone = remove_prefix(shm_dir(variables.value("BYTEPS_SHM_DIR", env)), prefix)
    if gone:
        say(f"removed {len(gone)} shared-memory file(s) of job {job!r} left by ended workers")


def _version() -> str:
    try:
        from importlib.metadata import version
        return version(DIST)
    except Exception:
        from byteps import __version__
        return __version__


def _hosts_or_list(args, ap) -> None:
    """--hosts N (emulated hosts), or horovodrun's --hosts H1:N,H2:N (= -H)."""
    raw = str(args.hosts).strip()
    if raw.lstrip("-").isdigit():
        args.hosts = int(raw)
    elif args.host_list:
        ap.error(f"--hosts {raw} and -H {args.host_list}: give the host list once")
    else:
        args.host_list, args.hosts = raw, 0


def parser() -> argparse.ArgumentParser:
    from byteps.launcher.envhelp import env_help
    ap = argparse.ArgumentParser(prog="bpslaunch", description=__doc__, epilog=env_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", "-v", action="version", version=f"bpslaunch {_version()} ({DIST})")
    ap.add_argument("--standalone", action="store_true",
                    help="start scheduler, servers and workers on this machine (implied by "
                         "-n/-s/--hosts when DMLC_ROLE is not set)")
    ap.add_argument("--num-workers", "-n", "-np", "--num-proc", type=int, default=0,
                    help="worker processes in total, as Horovod's -np: on this machine they "
                         "are one host (local ranks 0..N-1, local reduction) unless --hosts "
                         "or --local-size split them (standalone); with -H it must match "
                         "the slots")
    ap.add_argument("--num-servers", "-s", type=int, default=None,
                    help="servers (standalone; default 1)")
    ap.add_argument("--hosts", default="0",
                    help="emulated worker hosts on this machine (standalone): -np N --hosts "
                         "H runs H hosts of N/H workers each; a host list (horovodrun's "
                         "--hosts H1:N,H2:N) is -H's")
    ap.add_argument("--local-size", type=int, default=0,
                    help="worker processes per host (standalone: -np N --local-size L "
                         "emulates N/L hosts; cluster: the workers of this machine)")
    ap.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=None,
                    help="prefix each output line of a worker with [worker RANK] (default: on "
                         "whenever more than one worker writes; lines are never interleaved "
                         "either way)")
    ap.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                    help="standalone: a status line per worker (step, push_pull MB/s, round "
                         "latency, slowest server), redrawn in place on a terminal; elsewhere "
                         "printed every BYTEPS_LIVE_INTERVAL_S seconds (default 30; on when "
                         "that variable is set, with --live, or BYTEPS_LOG_LEVEL=INFO)")
    ap.add_argument("--slurm", action="store_true",
                    help="inside a Slurm allocation: srun bpslaunch --slurm python train.py "
                         "(roles and ranks from SLURM_*; docs/deployment.md)")
    ap.add_argument("--grace-period", type=float, default=10.0, metavar="S",
                    help="after SIGINT (Ctrl-C) the workers get SIGINT (KeyboardInterrupt) and "
                         "S seconds to end; then SIGTERM, then SIGKILL (default 10)")
    ap.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="standalone: start the whole job again after a failure, up to N "
                         "times (same job secret, new membership epoch; the script resumes "
                         "from its own checkpoint, see docs/fault_tolerance.md)")
    ap.add_argument("--restart-scheduler", action="store_true",
                    help="cluster role mode, given to every role's bpslaunch: a scheduler "
                         "killed by a signal is started again on its address and the others "
                         "wait for it (standalone and -H always do this)")
    from byteps.launcher import elastic, horovodrun, ssh
    ssh.add_arguments(ap)
    dashboard.add_argument(ap)              # --dashboard [PORT] (launcher/dashboard.py)
    elastic.add_arguments(ap)
    horovodrun.add_arguments(ap)            # horovodrun's names (launcher/horovodrun.py)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["k8s"]:                 # bpslaunch k8s ...: print Kubernetes manifests
        from byteps.launcher import k8s
        return k8s.main(argv[1:])
    ap = parser()
    args = ap.parse_args(dashboard.fix_argv(argv, ap))
    dashboard.check(args, ap)
    if args.stacks:                         # a running job's stacks, from its dashboard
        return dashboard.print_stacks(args.stacks)
    from byteps.launcher import horovodrun
    if args.check_build:
        return horovodrun.check_build()
    _hosts_or_list(args, ap)
    horovodrun.apply(args, ap)              # HOROVOD_* of horovodrun's options, for workers
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    servers_given = args.num_servers is not None
    if args.num_servers is None:
        args.num_servers = 1
    for v in ("num_workers", "num_servers", "hosts", "local_size", "grace_period",
              "max_restarts"):
        if getattr(args, v) < 0:
            ap.error(f"--{v.replace('_', '-')} must be >= 0")
    from byteps.launcher import supervise
    supervise.GRACE_PERIOD_S = args.grace_period
    if args.slurm and args.max_restarts:
        ap.error("--max-restarts restarts a --standalone job; under Slurm use --requeue")
    if args.host_list or args.hostfile:     # the whole job on several machines over ssh
        from byteps.launcher import elastic, ssh
        if args.slurm or args.standalone or args.max_restarts or args.hosts:
            ap.error("-H/--hostfile start a job over ssh; --slurm, --standalone, --hosts and "
                     "--max-restarts do not apply to it")
        elastic.check(args, ap)             # --min-workers: an elastic job over ssh
        args.num_servers_given = servers_given
        dashboard.cluster_env(args)
        return ssh.run(args, cmd)
    if args.slurm:                          # one Slurm task's share of the job
        from byteps.launcher import elastic, slurm
        elastic.check(args, ap)             # --min-workers: an elastic job of Slurm tasks
        args.num_servers_given = servers_given
        dashboard.cluster_env(args)
        return slurm.run(args, cmd)
    whole_job = bool(args.num_workers or args.hosts or servers_given)
    role = os.environ.get("DMLC_ROLE")
    if not args.standalone and whole_job:
        if role:
            ap.error(f"-n/--num-workers, -s/--num-servers and --hosts start a whole job on this "
                     f"machine, but DMLC_ROLE={role} is set; unset it, or use --local-size for "
                     f"the workers of this machine")
        args.standalone = True
    if args.max_restarts and not args.standalone:
        ap.error("--max-restarts restarts a --standalone job; on a cluster every machine's "
                 "processes must restart together: use the cluster manager's restarts (a "
                 "Kubernetes Job's backoffLimit, Slurm's --requeue) with BYTEPS_RESTART_COUNT "
                 "set to the attempt number")
    from byteps.launcher import elastic
    elastic.check(args, ap)                 # --min-workers: an elastic standalone job
    if args.standalone:
        if not cmd:
            ap.error("--standalone needs a command to run")
        if args.num_servers < 1:
            ap.error("--num-servers must be >= 1")
        args.num_servers_given = servers_given     # -np 1 without -s: no server
        return standalone(args, cmd)
    if not role and not cmd:
        ap.print_usage(sys.stderr)
        print("bpslaunch: nothing to run. On one machine: bpslaunch -np 2 python train.py; "
              "on a cluster set DMLC_ROLE and the other DMLC_* variables. bpslaunch --help "
              "lists the options and variables.", file=sys.stderr)
        return 2
    return role_mode(args, cmd)


if __name__ == "__main__":
    sys.exit(main())

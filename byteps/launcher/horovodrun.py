"""horovodrun's command line on bpslaunch: ``horovodrun ARGS python train.py`` runs as
``bpslaunch ARGS python train.py`` (docs/deployment.md, "From horovodrun").

* Its names for bpslaunch's own options are aliases there: ``--num-proc`` (``-np``),
  ``-hostfile``, ``-p``/``-i`` (``--ssh-port``/``--ssh-identity-file``),
  ``--network-interfaces``, ``--min-np``/``--max-np`` (``--min-workers``/``--max-workers``);
  ``--slots-per-host`` is elastic.py's.
* Its tuning options set the ``HOROVOD_*`` variable horovodrun sets for every worker
  (:data:`VALUES`, :data:`SWITCHES`); the workers' one config reads them
  (byteps/common/horovod_env.py) and rank 0 logs what each became.
* ``--gloo``, ``--mpi``, ``--jsrun``, ``--tcp``, ``--disable-cache`` and ``--verbose``
  choose or tune what horovodrun itself uses; they are accepted with a note.
* ``--check-build`` prints what this installation has, as horovodrun does, and exits.
* What bpslaunch cannot honour is refused with the reason (:data:`REFUSED`).
"""
from __future__ import annotations

import argparse
import os

# horovodrun option -> (the variable it sets, its type); --fusion-threshold-mb: MiB -> bytes
VALUES: dict[str, tuple[str, type]] = {
    "--fusion-threshold-mb": ("HOROVOD_FUSION_THRESHOLD", int),
    "--cycle-time-ms": ("HOROVOD_CYCLE_TIME", float),
    "--cache-capacity": ("HOROVOD_CACHE_CAPACITY", int),
    "--autotune-log-file": ("HOROVOD_AUTOTUNE_LOG", str),
    "--autotune-warmup-samples": ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", int),
    "--autotune-steps-per-sample": ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", int),
    "--autotune-bayes-opt-max-samples": ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", int),
    "--autotune-gaussian-process-noise": ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", float),
    "--timeline-filename": ("HOROVOD_TIMELINE", str),
    "--stall-check-warning-time-seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", int),
    "--stall-check-shutdown-time-seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", int),
    "--log-level": ("HOROVOD_LOG_LEVEL", str),
    "--num-nccl-streams": ("HOROVOD_NUM_NCCL_STREAMS", int),
    "--thread-affinity": ("HOROVOD_THREAD_AFFINITY", str),
    "--gloo-timeout-seconds": ("HOROVOD_GLOO_TIMEOUT_SECONDS", int),
    "--start-timeout": ("HOROVOD_START_TIMEOUT", int),
}
# (option setting 1, option setting 0, the variable)
SWITCHES: list[tuple[tuple, tuple, str]] = [
    (("--hierarchical-allreduce",), ("--no-hierarchical-allreduce",),
     "HOROVOD_HIERARCHICAL_ALLREDUCE"),
    (("--hierarchical-allgather",), ("--no-hierarchical-allgather",),
     "HOROVOD_HIERARCHICAL_ALLGATHER"),
    (("--torus-allreduce",), ("--no-torus-allreduce",), "HOROVOD_TORUS_ALLREDUCE"),
    (("--autotune",), ("--no-autotune",), "HOROVOD_AUTOTUNE"),
    (("--timeline-mark-cycles",), ("--no-timeline-mark-cycles",),
     "HOROVOD_TIMELINE_MARK_CYCLES"),
    (("--no-stall-check",), ("--stall-check",), "HOROVOD_STALL_CHECK_DISABLE"),
    (("--mpi-threads-disable",), ("--no-mpi-threads-disable",), "HOROVOD_MPI_THREADS_DISABLE"),
    (("--log-without-timestamp", "--log-hide-timestamp"),
     ("--log-with-timestamp", "--no-log-hide-timestamp"), "HOROVOD_LOG_HIDE_TIME"),
]
NOTED = {
    "--gloo": "byteps has one controller (its scheduler) and one transport (ZeroMQ)",
    "--mpi": "byteps has one controller (its scheduler) and one transport (ZeroMQ); no MPI",
    "--jsrun": "bpslaunch starts the processes itself (-H over ssh, --slurm inside srun)",
    "--tcp": "byteps always uses TCP between hosts (shared memory within one)",
    "--disable-cache": "bpslaunch keeps no cache of host checks",
    "--verbose": "bpslaunch prints what it starts; BYTEPS_LOG_LEVEL=DEBUG for more",
    "--prefix-output-with-timestamp": "worker lines are tagged [worker RANK] (--tag-output)",
}
REFUSED = {
    "--mpi-args": "there is no mpirun to pass arguments to",
    "--binding-args": "there is no mpirun to pass arguments to; BYTEPS_NUMA_ON binds the "
                      "workers of a host to its NUMA nodes",
    "--output-filename": "worker output goes to bpslaunch's terminal, tagged by rank; over "
                         "ssh, --log-dir DIR keeps each process's output in DIR",
    "--config-file": "give the options on the command line (each sets its HOROVOD_* "
                     "variable) or set the variables themselves",
    "--reset-limit": "an elastic job here re-forms as often as workers come and go while "
                     "--min-workers are alive; BYTEPS_ELASTIC_TIMEOUT bounds the wait",
    "--blacklist-cooldown-range": "a lost host is not blacklisted: the discovery script's "
                                  "next answer is taken as it is",
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """horovodrun's options not already bpslaunch's (their aliases are added there)."""
    g = ap.add_argument_group(
        "horovodrun's options", "accepted as horovodrun takes them (docs/deployment.md, "
        "\"From horovodrun\"): " + ", ".join(VALUES) + ", " +
        ", ".join(f"{on[0]}/{off[0]}" for on, off, _ in SWITCHES) +
        " set the HOROVOD_* variable horovodrun sets; " + ", ".join(NOTED) +
        " have no effect; " + ", ".join(REFUSED) + " are refused with the reason")
    for opt, (var, kind) in VALUES.items():
        g.add_argument(opt, dest=_dest(opt), type=kind, default=None, metavar=var[8:],
                       help=argparse.SUPPRESS)
    for on, off, var in SWITCHES:
        g.add_argument(*on, dest=_dest(var), action="store_const", const="1", default=None,
                       help=argparse.SUPPRESS)
        g.add_argument(*off, dest=_dest(var), action="store_const", const="0",
                       help=argparse.SUPPRESS)
    for opt in NOTED:
        names = (opt, "-prefix-timestamp") if opt == "--prefix-output-with-timestamp" \
            else (opt,)
        g.add_argument(*names, dest=_dest(opt), action="store_true", help=argparse.SUPPRESS)
    for opt in REFUSED:
        g.add_argument(opt, dest=_dest(opt), nargs="?", const="", default=None,
                       help=argparse.SUPPRESS)
    g.add_argument("-cb", "--check-build", action="store_true",
                   help="print the frameworks and transports this installation has, and exit")
    g.set_defaults(_horovodrun=True)


def _dest(name: str) -> str:
    return "hvdrun_" + name.lstrip("-").replace("-", "_").lower()


def apply(args: argparse.Namespace, ap: argparse.ArgumentParser, environ=os.environ,
          say=None) -> None:
    """Refuse what cannot be honoured (ap.error), note what has no effect, and set the
    ``HOROVOD_*`` variables of the options given in ``environ`` (for every worker)."""
    for opt, why in REFUSED.items():
        if getattr(args, _dest(opt)) is not None:
            ap.error(f"horovodrun's {opt} has no equivalent here: {why}")
    if say is None:
        from byteps.launcher.supervise import say
    for opt, why in NOTED.items():
        if getattr(args, _dest(opt)):
            say(f"horovodrun's {opt} has no effect: {why}")
    for opt, (var, _) in VALUES.items():
        value = getattr(args, _dest(opt))
        if value is not None:
            if opt == "--fusion-threshold-mb":
                value = value * 1024 * 1024
            environ[var] = str(value)
    for _, _, var in SWITCHES:
        value = getattr(args, _dest(var))
        if value is not None:
            environ[var] = value


def check_build(say=print) -> int:
    """horovodrun --check-build: what this installation has (nothing is imported)."""
    from byteps import __version__
    from byteps.common.util import BUILD, extension_available

    def mark(ok: bool) -> str:
        return "[X]" if ok else "[ ]"
    lines = [f"byteps v{__version__}:", "", "Available Frameworks:"]
    lines += [f"    {mark(extension_available(ext))} {name}" for name, ext in
              (("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("MXNet", "mxnet"),
               ("numpy / JAX", "numpy"))]
    lines += ["", "Available Controllers:", "    [X] byteps scheduler",
              f"    {mark(BUILD['mpi_built'])} MPI", f"    {mark(BUILD['gloo_built'])} Gloo",
              "", "Available Tensor Operations:",
              "    [X] CPU summation servers (ZeroMQ over TCP; shared memory on one host)",
              f"    {mark(BUILD['nccl_built'])} NCCL", f"    {mark(BUILD['mpi_built'])} MPI",
              f"    {mark(BUILD['gloo_built'])} Gloo"]
    say("\n".join(lines))
    return 0

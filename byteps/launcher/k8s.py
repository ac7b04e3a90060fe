"""``bpslaunch k8s``: print the Kubernetes manifests of a byteps job as YAML.

    bpslaunch k8s --workers 4 --gpus-per-worker 8 --servers 4 --image IMAGE \\
        -- python train.py > job.yaml        # also writes byteps-secret.yaml (0600)
    kubectl apply -f byteps-secret.yaml -f job.yaml

The manifests (all labelled ``byteps.io/job: NAME``):

* a Secret holding ``BYTEPS_JOB_SECRET``: generated into its own file, never onto
  standard output (``--secret-file``, default ``NAME-secret.yaml``, mode 0600; apply it
  first), or one you made (``--secret-name``); the manifests only refer to it;
* a headless Service ``NAME-scheduler`` (its name resolves to the scheduler pod's own
  address, so every ZeroMQ connection goes pod to pod) and the scheduler Pod;
* an indexed Job of ``--servers`` server pods and one of ``--workers`` worker pods;
  ``DMLC_WORKER_ID`` is the pod's completion index; each worker pod runs
  ``bpslaunch --local-size G`` (G = ``--gpus-per-worker``, or ``--procs-per-worker``
  without GPUs), which starts one process per GPU;
* a memory-backed ``/dev/shm`` (``emptyDir: {medium: Memory}``) sized for the local
  reduction, resource requests and limits, and a NetworkPolicy that admits only
  the job's own pods.

Every process listens on its pod's IP (``DMLC_NODE_HOST`` from ``status.podIP``).

Elastic (``--min-workers N --max-workers M``, docs/fault_tolerance.md): the workers are a
scalable non-indexed Job instead (``parallelism`` = ``--workers``, default N; scale with
``kubectl patch job NAME-workers --type=merge -p '{"spec":{"parallelism":K}}'``, K between
N and M).  Each worker pod runs one worker process without ``DMLC_WORKER_ID``: the
scheduler (``BYTEPS_MIN_WORKERS``/``BYTEPS_MAX_WORKERS``) starts the job once N have
registered, lets a new pod in at the members' next ``state.commit()``, and re-forms the
group without a deleted or failed pod; ranks are the scheduler's dense ranks.  A pod is
never restarted in place (``restartPolicy: Never``): the Job controller replaces a lost
pod by a new one (new name, new IP), which joins as a new worker; once a worker finished
the training (exit 0) the Job starts no more pods.
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import sys

from byteps.launcher.yaml_out import dump_all

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_LABEL = "byteps.io/job"
ROLE_LABEL = "byteps.io/role"
SECRET_KEY = "BYTEPS_JOB_SECRET"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bpslaunch k8s", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__)
    ap.add_argument("--name", default="byteps", help="job name, prefix of every object "
                    "(DNS label, <= 42 characters; default byteps)")
    ap.add_argument("--namespace", default=None, help="metadata.namespace of every object")
    ap.add_argument("--image", required=True, help="container image with byteps installed "
                    "(see the Dockerfile)")
    ap.add_argument("--image-pull-policy", default="IfNotPresent",
                    choices=("Always", "IfNotPresent", "Never"))
    ap.add_argument("--workers", type=int, default=None,
                    help="worker pods (machines); elastic: the initial parallelism "
                         "(default --min-workers)")
    ap.add_argument("--gpus-per-worker", type=int, default=0,
                    help="GPUs per worker pod (nvidia.com/gpu); one process per GPU")
    ap.add_argument("--procs-per-worker", type=int, default=1,
                    help="processes per worker pod without GPUs (default 1)")
    ap.add_argument("--servers", type=int, required=True, help="server pods (CPU only)")
    ap.add_argument("--port", type=int, default=9000, help="the scheduler's port")
    ap.add_argument("--worker-cpu", default="4", help="CPU request and limit of a worker pod")
    ap.add_argument("--worker-memory", default="16Gi",
                    help="memory request and limit of a worker pod (/dev/shm counts in it)")
    ap.add_argument("--server-cpu", default="4", help="CPU request and limit of a server pod")
    ap.add_argument("--server-memory", default="8Gi", help="memory of a server pod")
    ap.add_argument("--shm-size", default=None,
                    help="size of each worker pod's /dev/shm (default: 1Gi per local "
                         "process + 1Gi)")
    ap.add_argument("--secret-name", default=None,
                    help=f"use this existing Secret (key {SECRET_KEY}) instead of "
                         f"generating one")
    ap.add_argument("--secret-file", default=None, metavar="PATH",
                    help="where the generated Secret manifest goes (mode 0600; kept if it "
                         "exists; default NAME-secret.yaml here): the secret is never "
                         "printed with the other manifests")
    ap.add_argument("--workdir", default=None, help="working directory of every container")
    ap.add_argument("--env", "-x", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment variable of every pod (repeatable)")
    ap.add_argument("--no-network-policy", action="store_true",
                    help="leave out the NetworkPolicy")
    g = ap.add_argument_group("elastic workers (docs/fault_tolerance.md)")
    g.add_argument("--min-workers", type=int, default=0, metavar="N",
                   help="elastic: a scalable Job of one-process worker pods; training starts "
                        "once N are up and goes on while at least N remain")
    g.add_argument("--max-workers", type=int, default=0, metavar="M",
                   help="elastic: at most M workers (default --workers); pods beyond M "
                        "are refused by the scheduler")
    g.add_argument("--elastic-timeout", type=float, default=None, metavar="S",
                   help="elastic: end the job after S seconds below N workers "
                        "(BYTEPS_ELASTIC_TIMEOUT; default BYTEPS_STARTUP_TIMEOUT)")
    g.add_argument("--backoff-limit", type=int, default=None, metavar="B",
                   help="elastic: failed worker pods the Job replaces before it fails "
                        "(default 10 x M; evicted or preempted pods do not count)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="the training command, after --")
    return ap


def _meta(o, name: str, role: str | None = None) -> dict:
    labels = {"app.kubernetes.io/name": "byteps", JOB_LABEL: o.name}
    if role:
        labels[ROLE_LABEL] = role
    meta = {"name": name, "labels": labels}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def _env(o, role: str) -> list[dict]:
    def field(path: str) -> dict:
        return {"fieldRef": {"fieldPath": path}}
    env = [{"name": "DMLC_ROLE", "value": role},
           {"name": "DMLC_NUM_WORKER", "value": str(o.min_workers or o.workers)},
           {"name": "DMLC_NUM_SERVER", "value": str(o.servers)},
           {"name": "DMLC_PS_ROOT_PORT", "value": str(o.port)},
           {"name": "BYTEPS_JOB_ID", "value": o.name},
           {"name": SECRET_KEY, "valueFrom": {"secretKeyRef": {
               "name": o.secret_name, "key": SECRET_KEY}}},
           {"name": "DMLC_NODE_HOST", "valueFrom": field("status.podIP")}]
    if role == "scheduler":     # it listens on the address DMLC_PS_ROOT_URI names: its own
        env.append({"name": "DMLC_PS_ROOT_URI", "valueFrom": field("status.podIP")})
    else:
        env.append({"name": "DMLC_PS_ROOT_URI", "value": f"{o.name}-scheduler"})
    if o.min_workers:           # the scheduler's elastic membership (scheduler/membership.py)
        env += [{"name": "BYTEPS_MIN_WORKERS", "value": str(o.min_workers)},
                {"name": "BYTEPS_MAX_WORKERS", "value": str(o.max_workers)}]
        if o.elastic_timeout is not None:
            env.append({"name": "BYTEPS_ELASTIC_TIMEOUT", "value": f"{o.elastic_timeout:g}"})
    elif role == "worker":      # (elastic: no id; the scheduler gives dense ranks)
        env.append({"name": "DMLC_WORKER_ID", "valueFrom": field(
            f"metadata.annotations['{INDEX_ANNOTATION}']")})
    env += [{"name": k, "value": v} for k, v in o.extra_env]
    return env


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict:
    res = {"cpu": cpu, "memory": memory}
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(res), "limits": dict(res)}


def _pod_spec(o, role: str, args: list[str], resources: dict, shm: str | None) -> dict:
    container = {"name": role, "image": o.image, "imagePullPolicy": o.image_pull_policy,
                 "command": ["bpslaunch"], "args": args, "env": _env(o, role),
                 "resources": resources}
    if role == "scheduler":
        container["ports"] = [{"name": "scheduler", "containerPort": o.port}]
    if o.workdir:
        container["workingDir"] = o.workdir
    spec = {"restartPolicy": "Never", "enableServiceLinks": False, "containers": [container]}
    if shm:
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                          "sizeLimit": shm}}]
    return spec


def _indexed_job(o, role: str, count: int, spec: dict) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(o, f"{o.name}-{role}s", role),
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count,
                     "backoffLimit": 0,
                     "template": {"metadata": {"labels": _meta(o, "x", role)["labels"]},
                                  "spec": spec}}}


def _elastic_job(o, spec: dict) -> dict:
    """The elastic workers: a non-indexed Job whose ``parallelism`` is the worker count
    (scaled with kubectl patch).  No completions: once one pod succeeded (the training
    ended) no new pods start, and the Job completes when all have ended; a failed or
    deleted pod is replaced by a new one, which joins as a new worker."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(o, f"{o.name}-workers", "worker"),
            "spec": {"completionMode": "NonIndexed", "parallelism": o.workers,
                     "backoffLimit": o.backoff_limit,
                     "podFailurePolicy": {"rules": [{
                         "action": "Ignore", "onPodConditions": [
                             {"type": "DisruptionTarget", "status": "True"}]}]},
                     "template": {"metadata": {"labels": _meta(o, "x", "worker")["labels"]},
                                  "spec": spec}}}


def secret_manifest(o) -> dict:
    """The Secret of a fresh job secret (written to ``--secret-file``, never printed)."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o, o.secret_name),
            "type": "Opaque", "stringData": {SECRET_KEY: secrets.token_hex(32)}}


def write_secret(o) -> bool:
    """Write the generated Secret to ``o.secret_file`` (created with mode 0600); an
    existing file is kept (the job's secret stays the same).  Returns whether it wrote."""
    try:
        fd = os.open(o.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"# the job secret of bpslaunch k8s --name {o.name}: keep this file private\n")
        f.write(dump_all([secret_manifest(o)]))
    return True


def manifests(o) -> list[dict]:
    """The job's objects, in the order to apply them, after the Secret (``write_secret``;
    the manifests only refer to it by name)."""
    docs = []
    if o.network_policy:
        sel = {"matchLabels": {JOB_LABEL: o.name}}
        docs.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": _meta(o, f"{o.name}-only-job-pods"),
                     "spec": {"podSelector": sel, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": sel}]}]}})
    docs.append({"apiVersion": "v1", "kind": "Service",
                 "metadata": _meta(o, f"{o.name}-scheduler", "scheduler"),
                 "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                          "selector": {JOB_LABEL: o.name, ROLE_LABEL: "scheduler"},
                          "ports": [{"name": "scheduler", "port": o.port,
                                     "targetPort": o.port}]}})
    small = _resources("1", "1Gi")
    docs.append({"apiVersion": "v1", "kind": "Pod",
                 "metadata": _meta(o, f"{o.name}-scheduler", "scheduler"),
                 "spec": _pod_spec(o, "scheduler", [], small, None)})
    docs.append(_indexed_job(o, "server", o.servers, _pod_spec(
        o, "server", [], _resources(o.server_cpu, o.server_memory), None)))
    wspec = _pod_spec(o, "worker", ["--local-size", str(o.local_size), *o.command],
                      _resources(o.worker_cpu, o.worker_memory, o.gpus_per_worker), o.shm_size)
    docs.append(_elastic_job(o, wspec) if o.min_workers
                else _indexed_job(o, "worker", o.workers, wspec))
    return docs


def options(argv: list[str]) -> argparse.Namespace:
    """Parsed and checked options (argparse errors exit 2 with one line)."""
    ap = parser()
    o = ap.parse_args(argv)
    cmd = o.command[1:] if o.command[:1] == ["--"] else o.command
    if not cmd:
        ap.error("the training command is missing: bpslaunch k8s ... -- python train.py")
    o.command = cmd
    if not _NAME.match(o.name):
        ap.error(f"--name {o.name!r} must be a DNS label of at most 42 characters "
                 f"(lower-case letters, digits, '-'), e.g. byteps-resnet")
    if o.gpus_per_worker < 0 or o.procs_per_worker < 1:
        ap.error("--gpus-per-worker must be >= 0 and --procs-per-worker >= 1")
    _check_elastic(o, ap)
    for flag in ("workers", "servers"):
        if getattr(o, flag) < 1:
            ap.error(f"--{flag} must be >= 1")
    if not 1 <= o.port <= 65535:
        ap.error("--port must be 1..65535")
    o.local_size = o.gpus_per_worker or o.procs_per_worker
    o.shm_size = o.shm_size or f"{o.local_size + 1}Gi"
    o.generate_secret = o.secret_name is None
    if o.secret_file and not o.generate_secret:
        ap.error("--secret-file is where a generated secret goes; --secret-name uses an "
                 "existing Secret: give one of them")
    o.secret_name = o.secret_name or f"{o.name}-secret"
    o.secret_file = o.secret_file or f"{o.name}-secret.yaml"
    o.network_policy = not o.no_network_policy
    o.extra_env = []
    for item in o.env:
        k, eq, v = item.partition("=")
        if not eq or not _ENV.match(k):
            ap.error(f"--env {item!r}: use KEY=VALUE")
        o.extra_env.append((k, v))
    return o


def _check_elastic(o, ap) -> None:
    """--min-workers/--max-workers: the counts, and one worker process per pod."""
    if not (o.min_workers or o.max_workers or o.elastic_timeout is not None
            or o.backoff_limit is not None):
        if o.workers is None:
            ap.error("--workers is required (or --min-workers N for elastic workers)")
        return
    if o.min_workers < 1:
        ap.error("--max-workers, --elastic-timeout and --backoff-limit need --min-workers N "
                 "(N >= 1)")
    o.workers = o.min_workers if o.workers is None else o.workers
    o.max_workers = o.max_workers or max(o.workers, o.min_workers)
    if o.max_workers < o.min_workers:
        ap.error(f"--max-workers {o.max_workers} is below --min-workers {o.min_workers}")
    if not o.min_workers <= o.workers <= o.max_workers:
        ap.error(f"--workers {o.workers} (the initial pods) must lie between --min-workers "
                 f"{o.min_workers} and --max-workers {o.max_workers}")
    if o.gpus_per_worker > 1 or o.procs_per_worker > 1:
        ap.error("--min-workers: elastic worker pods run one worker process each (the "
                 "group re-forms worker by worker, which local reduction cannot follow); "
                 "use --gpus-per-worker 1 (or --procs-per-worker 1) and more pods")
    if o.elastic_timeout is not None and o.elastic_timeout <= 0:
        ap.error("--elastic-timeout must be > 0")
    if o.backoff_limit is None:
        o.backoff_limit = 10 * o.max_workers
    if o.backoff_limit < 0:
        ap.error("--backoff-limit must be >= 0")


def main(argv: list[str]) -> int:
    """Print the manifests; the command line they came from goes into a comment."""
    o = options(argv)
    secret = ""
    if o.generate_secret:
        try:
            wrote = write_secret(o)
        except OSError as exc:
            print(f"bpslaunch k8s: cannot write the job secret to {o.secret_file}: "
                  f"{exc.strerror or exc} (--secret-file PATH elsewhere, or --secret-name "
                  f"an existing Secret)", file=sys.stderr)
            return 2
        where = os.path.abspath(o.secret_file)
        print(f"bpslaunch k8s: {'wrote' if wrote else 'kept the existing'} Secret "
              f"{o.secret_name} (the job secret) in {where}"
              f"{' (mode 0600)' if wrote else ''}; apply it first: kubectl apply -f "
              f"{shlex.quote(o.secret_file)}", file=sys.stderr)
        secret = (f"# Secret {o.secret_name}: not printed here; apply it first: "
                  f"kubectl apply -f {shlex.quote(o.secret_file)}\n")
    sys.stdout.write(f"# bpslaunch k8s {shlex.join(argv)}\n{secret}"
                     f"# apply: kubectl apply -f FILE; remove: kubectl delete -f FILE\n")
    sys.stdout.write(dump_all(manifests(o)))
    return 0

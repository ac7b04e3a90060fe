"""``RayExecutor``: a BytePS job (scheduler, servers, workers) as Ray actors."""
from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from byteps.common import torchrun
from byteps.common.config import NAMES_CHECKED, Config, ConfigError
from byteps.ray._actors import ServiceActor, WorkerActor, describe
from byteps.ray.errors import RayExecutorError, WorkerFailedError

log = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# variables of the driver that are per process or per job, never copied to the actors
_NOT_PROPAGATED = {"DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NODE_HOST", "DMLC_NUM_WORKER",
                   "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                   "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_JOB_SECRET",
                   "BYTEPS_EMULATED_HOST", NAMES_CHECKED}
POLL_S = 0.2


@dataclass
class Settings:
    """What :meth:`RayExecutor.create_settings` returns (Horovod's ``MiniSettings``):
    ``timeout_s`` bounds the job's start (``BYTEPS_STARTUP_TIMEOUT``),
    ``placement_group_timeout_s`` the placement of the actors, ``nics`` (one interface
    name) is ``DMLC_INTERFACE``.  ``ssh_identity_file`` is kept and unused: Ray starts
    every process, nothing is reached over ssh."""

    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    nics: Any = None
    ssh_identity_file: str | None = None


class RayExecutor:
    """A BytePS job on Ray: ``num_workers`` workers (one per actor, local size 1) and
    ``num_servers`` servers, plus the scheduler, in one placement group.

    Horovod's signature comes first, so Horovod's Ray scripts run with the import changed:
    ``RayExecutor(settings, num_workers=None, num_hosts=None, num_workers_per_host=1,
    cpus_per_worker=1, use_gpu=False, gpus_per_worker=None, ...)`` with ``settings`` from
    :meth:`create_settings` (or None).  ``num_hosts=H, num_workers_per_host=L`` places the
    workers in H bundles of L (each bundle on one node, the bundles spread over the nodes
    unless ``strategy`` says otherwise) and gives each bundle's workers local ranks 0..L-1
    of one host, so they reduce locally first (shared memory), as ``bpslaunch
    --local-size L`` does.  Horovod's elastic arguments (``min_workers``...) are refused:
    an elastic job is ``bpslaunch --min-workers`` (docs/fault_tolerance.md).
    ``use_current_placement_group`` is accepted; byteps always reserves its own group
    (its servers need bundles too).

    ``start()`` places the actors; ``run(train_fn, args, kwargs)`` starts a scheduler and
    the servers, runs ``train_fn`` on every worker (it calls ``bps.init()`` as in any
    BytePS script) and returns its results ordered by rank; ``shutdown()`` ends every
    actor and process.  ``run`` may be called several times; each call is a new BytePS
    job (the same secret, a new scheduler port).

    ``strategy``: the placement group's strategy (PACK: as few nodes as possible;
    SPREAD: across nodes).  ``env``: extra ``BYTEPS_*`` (or other) variables for every
    role; the driver's own ``BYTEPS_*``/``DMLC_*`` variables are passed on too, except
    the per-process ones.  The job secret is generated here and passed to the actors as
    an argument (never on a command line).
    """

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None) -> Settings:
        """Horovod's ``RayExecutor.create_settings``: see :class:`Settings`.  ``ssh_str`` (a
        private key Horovod would write to ``ssh_identity_file``) is not written: nothing
        here uses ssh."""
        if nics is not None and len(set(nics)) > 1:
            raise ValueError(f"create_settings(nics={nics!r}): byteps uses one interface "
                             f"(DMLC_INTERFACE); name one")
        return Settings(timeout_s, placement_group_timeout_s, nics, ssh_identity_file)

    def __init__(self, settings: Settings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group=True,
                 min_workers=None, max_workers=None, reset_limit=None, cooldown_range=None,
                 elastic_timeout=600, override_discovery=True, *, num_servers: int = 1,
                 cpus_per_server: float = 1, strategy: str | None = None,
                 env: Mapping[str, str] | None = None,
                 placement_timeout_s: float | None = None, job_id: str | None = None):
        if settings is not None and not isinstance(settings, Settings):
            raise TypeError(f"RayExecutor's first argument is Horovod's settings "
                            f"(RayExecutor.create_settings(), or None), got {settings!r}; "
                            f"give num_workers= by name")
        if min_workers is not None or max_workers is not None:
            raise ValueError("RayExecutor(min_workers=..., max_workers=...): an elastic job "
                             "is bpslaunch --min-workers/--max-workers (a scheduler that "
                             "re-forms the membership, docs/fault_tolerance.md); "
                             "byteps.ray runs jobs of a fixed size")
        if num_hosts is not None:
            if num_workers is not None:
                raise ValueError("give num_workers, or num_hosts and num_workers_per_host, "
                                 "not both")
            if num_hosts < 1 or num_workers_per_host < 1:
                raise ValueError(f"num_hosts={num_hosts} and num_workers_per_host="
                                 f"{num_workers_per_host} must be at least 1")
            num_workers = num_hosts * num_workers_per_host
        self.per_host = num_workers_per_host if num_hosts is not None else 1
        num_workers = 1 if num_workers is None else num_workers
        given, settings = settings is not None, settings or Settings()
        if placement_timeout_s is None:
            placement_timeout_s = settings.placement_group_timeout_s
        strategy = strategy or ("PACK" if num_hosts is None else "SPREAD")
        if num_workers < 1 or num_servers < 1:
            raise ValueError(f"num_workers={num_workers} and num_servers={num_servers} must "
                             f"be at least 1")
        strategy = strategy.upper()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r}: use one of {', '.join(STRATEGIES)}")
        if cpus_per_server <= 0:
            raise ValueError("cpus_per_server must be > 0 (the bundle of a server holds the "
                             "scheduler too)")
        self.num_workers, self.num_servers = num_workers, num_servers
        self.cpus_per_worker, self.cpus_per_server = cpus_per_worker, cpus_per_server
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.strategy, self.placement_timeout_s = strategy, placement_timeout_s
        self.env = {"BYTEPS_STARTUP_TIMEOUT": str(settings.timeout_s)} if given else {}
        if settings.nics:
            self.env["DMLC_INTERFACE"] = str(next(iter(settings.nics)))
        self.env.update({str(k): str(v) for k, v in (env or {}).items()})
        self.job_id = job_id or f"ray-{secrets.token_hex(4)}"
        self._secret = secrets.token_hex(16)
        self._pg = None
        self._scheduler = None
        self._servers: list = []
        self._workers: list = []
        self._hosts: dict[str, dict] = {}       # "worker 0", "server 1", "scheduler" -> host
        self._runs = 0
        self._service_pids: dict[str, int] = {}  # the last run's scheduler and servers

    # ------------------------------------------------------------------ lifecycle
    def start(self, executable_cls: type | None = None, executable_args=None,
              executable_kwargs=None, extra_env_vars: Mapping[str, str] | None = None) -> None:
        """Reserve the placement group and create the actors (raises RayExecutorError
        when the cluster cannot hold them within ``placement_timeout_s``).
        ``extra_env_vars`` (Horovod's) are added to every role's variables.  Horovod's
        ``executable_cls`` (an object built once in every worker, before any job) is
        refused: each ``run()`` is one byteps job that ends with it, so an object that
        outlives it would hold a finished job's state; build it inside the function."""
        if executable_cls is not None or executable_args or executable_kwargs:
            raise ValueError("RayExecutor.start(executable_cls=...): byteps runs a function "
                             "per job (run(fn) or execute(fn)); build the object inside it")
        self.env.update({str(k): str(v) for k, v in (extra_env_vars or {}).items()})
        if self._pg is not None:
            return
        if not ray.is_initialized():
            ray.init()
        bundles = [{"CPU": self.cpus_per_server} for _ in range(self.num_servers)]
        k = self.per_host                 # workers per bundle: one node's local ranks
        for _ in range(self.num_workers // k):
            b = {"CPU": self.cpus_per_worker * k} if self.cpus_per_worker else {}
            if self.gpus_per_worker:
                b["GPU"] = self.gpus_per_worker * k
            if not b:
                raise ValueError("a worker needs cpus_per_worker > 0 or use_gpu=True")
            bundles.append(b)
        self._pg = placement_group(bundles, strategy=self.strategy,
                                   name=f"byteps-{self.job_id}")
        try:
            ray.get(self._pg.ready(), timeout=self.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            need = _total(bundles)
            self._release()
            raise RayExecutorError(
                f"the placement group of {self.num_servers} server(s) and "
                f"{self.num_workers} worker(s) ({need}, strategy {self.strategy}) was not "
                f"placed within {self.placement_timeout_s:g} s; the cluster has "
                f"{ray.available_resources()} free: ask for fewer resources, or add nodes"
            ) from None

        def at(i: int) -> dict:
            return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=i)}
        service = ray.remote(ServiceActor)
        worker = ray.remote(WorkerActor)
        # the scheduler shares the first server's bundle (it needs little CPU)
        self._scheduler = service.options(num_cpus=0, **at(0)).remote("scheduler")
        self._servers = [service.options(num_cpus=self.cpus_per_server, **at(i))
                         .remote(f"server {i}") for i in range(self.num_servers)]
        self._workers = [worker.options(num_cpus=self.cpus_per_worker,
                                        num_gpus=self.gpus_per_worker,
                                        **at(self.num_servers + i // k)).remote(i)
                         for i in range(self.num_workers)]
        names = (["scheduler"] + [f"server {i}" for i in range(self.num_servers)]
                 + [f"worker {i}" for i in range(self.num_workers)])
        actors = [self._scheduler] + self._servers + self._workers
        try:
            hosts = ray.get([a.host.remote() for a in actors], timeout=self.placement_timeout_s)
        except Exception as exc:
            self.shutdown()
            raise RayExecutorError(f"the byteps actors did not start: {exc}") from exc
        self._hosts = dict(zip(names, hosts))
        log.info("byteps on Ray: %s", {n: describe(h) for n, h in self._hosts.items()})

    def shutdown(self) -> None:
        """Stop the byteps processes, kill the actors and remove the placement group."""
        services = [a for a in [self._scheduler] + self._servers if a is not None]
        if services:
            try:
                ray.get([a.stop.remote() for a in services], timeout=15)
            except Exception as exc:  # noqa: BLE001 - the actor is gone: so is its process
                log.debug("stopping the services: %s", exc)
        for a in services + self._workers:
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already dead
                log.debug("ray.kill: %s", exc)
        self._scheduler, self._servers, self._workers = None, [], []
        self._release()

    def _release(self) -> None:
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception as exc:  # noqa: BLE001 - Ray is already shut down
                log.debug("remove_placement_group: %s", exc)
            self._pg = None

    def __enter__(self):  # -> the executor, started
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ one job
    def hosts(self) -> dict[str, str]:
        """Where each role runs: {"scheduler": "node, 10.0.0.1", "worker 0": ...}."""
        return {n: describe(h) for n, h in self._hosts.items()}

    def execute(self, fn: Callable[[Any], Any], callbacks=None) -> list:
        """Horovod's ``execute``: ``fn(None)`` on every worker as one job (Horovod passes
        the ``executable_cls`` object, which byteps does not build: None)."""
        return self.run(fn, args=(None,), callbacks=callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Horovod's ``execute_single``: ``fn(None)`` on worker 0 only, outside any job
        (``init()`` there makes a job of one worker); its return value."""
        if self._pg is None:
            raise RayExecutorError("RayExecutor.execute_single() before start(): call "
                                   "start() first")
        out = ray.get(self._workers[0].execute.remote({}, ray.put(fn), (None,), {}))
        if out[0] != "ok":
            raise WorkerFailedError(0, self._host("worker 0"), out[1], out[2])
        return out[1]

    def run_remote(self, fn, args=None, kwargs=None):
        """Horovod's ``run_remote`` (the workers' object references, unsupervised) is
        refused: a byteps job's scheduler and servers live and end with one supervised
        ``run()``, which returns the results by rank."""
        raise RayExecutorError("RayExecutor.run_remote(): use run(fn, args, kwargs), which "
                               "supervises the job and returns its results by rank")

    def run(self, train_fn: Callable[..., Any], args: tuple | list | None = None,
            kwargs: dict | None = None, callbacks=None) -> list:
        """Run ``train_fn(*args, **kwargs)`` on every worker as one BytePS job; its return
        values, ordered by rank.  On a failure (``train_fn`` raised on some rank, an actor
        died, a scheduler or server process ended with an error) every actor is ended and
        ``WorkerFailedError`` (rank, host, cause) or ``RayExecutorError`` is raised.
        Horovod's ``callbacks`` receive what rank 0 logs through ``horovod.ray.ray_logger``,
        which byteps does not have: they are refused; return the values instead."""
        if callbacks:
            raise ValueError("RayExecutor.run(callbacks=...): byteps has no ray_logger to "
                             "feed them; return what rank 0 would log from the function "
                             "(run() returns every rank's value)")
        if self._pg is None:
            raise RayExecutorError("RayExecutor.run() before start() (or after a failure "
                                   "or shutdown()): call start() first")
        self._runs += 1
        base, worker_envs = self._envs()
        sched_host = self._hosts["scheduler"]
        services = [("scheduler", self._scheduler)] + [
            (f"server {i}", a) for i, a in enumerate(self._servers)]
        try:
            pids = [ray.get(self._scheduler.start.remote(
                "byteps.launcher._scheduler", _service_env(base, "scheduler", sched_host)))]
            pids += ray.get([a.start.remote("byteps.server", _service_env(
                base, "server", self._hosts[f"server {i}"]))
                for i, a in enumerate(self._servers)])
            self._service_pids = {name: pid for (name, _), pid in zip(services, pids)}
        except Exception as exc:
            self.shutdown()
            raise RayExecutorError(f"starting the scheduler and servers failed: {exc}") \
                from exc
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        fn_ref = ray.put(train_fn)
        refs = [w.execute.remote(env, fn_ref, args, kwargs)
                for w, env in zip(self._workers, worker_envs)]
        rank_of = {r: i for i, r in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                failures = []
                for ref in done:
                    rank = rank_of[ref]
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        failures.append(WorkerFailedError(
                            rank, self._host(f"worker {rank}"),
                            f"its Ray actor died: {_first_line(exc)}"))
                        continue
                    if out[0] == "ok":
                        results[rank] = out[1]
                    else:
                        failures.append(WorkerFailedError(rank, self._host(f"worker {rank}"),
                                                          out[1], out[2]))
                if failures:
                    raise _root_cause(failures)
                if pending:
                    self._check_services(services)
        except BaseException:
            self.shutdown()         # ends the other ranks, wherever they are blocked
            raise
        self._stop_services(services)
        return results

    # ------------------------------------------------------------------ helpers
    def _host(self, name: str) -> str:
        h = self._hosts.get(name)
        return describe(h) if h else "unknown host"

    def _envs(self) -> tuple[dict, list[dict]]:
        """The job's common variables and each worker's (validated, ConfigError ->
        RayExecutorError before anything starts)."""
        n = self.num_workers
        base = {k: v for k, v in os.environ.items()
                if k.startswith(("BYTEPS_", "DMLC_")) and k not in _NOT_PROPAGATED}
        base.update(self.env)
        base.update(DMLC_NUM_WORKER=str(n // self.per_host),    # hosts of per_host workers
                    DMLC_NUM_SERVER=str(self.num_servers),
                    DMLC_PS_ROOT_URI=self._hosts["scheduler"]["ip"],
                    DMLC_PS_ROOT_PORT=str(ray.get(self._scheduler.free_port.remote())),
                    BYTEPS_JOB_ID=self.job_id, BYTEPS_JOB_SECRET=self._secret,
                    BYTEPS_FORCE_DISTRIBUTED="1")
        workers, k = [], self.per_host      # k workers of one bundle: one host's
        for i in range(n):
            env = torchrun.apply(base, i // k, i % k, k, n // k)
            env.update(DMLC_ROLE="worker", DMLC_WORKER_ID=str(i // k),
                       BYTEPS_LOCAL_RANK=str(i % k), BYTEPS_LOCAL_SIZE=str(k))
            if "DMLC_INTERFACE" not in base:
                env["DMLC_NODE_HOST"] = self._hosts[f"worker {i}"]["ip"]
            workers.append(env)
        try:
            for role, env in (("scheduler", base), ("server", base), ("worker", workers[0])):
                Config.from_env(dict(env, DMLC_ROLE=role), role=role, warn_unknown=False)
        except ConfigError as exc:
            raise RayExecutorError(f"the job's configuration: {exc}") from None
        return base, workers

    def _check_services(self, services: list) -> None:
        states = ray.get([a.poll.remote() for _, a in services])
        for (name, _), (rc, tail) in zip(services, states):
            if rc not in (None, 0):
                text = f"the byteps {name} (host {self._host(name)}) exited with code {rc}"
                if tail:
                    text += f"; its last output:\n{tail}"
                raise RayExecutorError(text)

    def _stop_services(self, services: list) -> None:
        try:
            ray.get([a.stop.remote() for _, a in services], timeout=15)
        except Exception as exc:  # noqa: BLE001 - the results are in; report, go on
            log.warning("stopping the byteps scheduler and servers: %s", exc)


def _service_env(base: dict, role: str, host: dict) -> dict:
    """The job's variables of a scheduler or server process (the actor adds its own
    environment: PATH, PYTHONPATH, Ray's)."""
    env = dict(base, DMLC_ROLE=role, **{NAMES_CHECKED: "1"})
    if "DMLC_INTERFACE" not in base:
        env["DMLC_NODE_HOST"] = host["ip"]
    return env


def _root_cause(failures: list[WorkerFailedError]) -> WorkerFailedError:
    """Of failures seen together, the one that is not only a consequence of another
    (a BytePSError about the job ending is a consequence)."""
    own = [f for f in failures if "BytePSError" not in f.cause and "actor died" not in f.cause]
    return min(own or failures, key=lambda f: f.rank)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _total(bundles: list[dict]) -> str:
    tot: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            tot[k] = tot.get(k, 0) + v
    return ", ".join(f"{v:g} {k}" for k, v in tot.items())

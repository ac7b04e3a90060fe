"""``bpslaunch k8s --min-workers N --max-workers M`` (issue 24): elastic workers on
Kubernetes.  The manifests validate against the Kubernetes schemas (a scalable non-indexed
worker Job), and they run: the pods' commands and environment, read from the manifests,
are started as local processes by a small stand-in for the Job controller (it keeps
``parallelism`` worker pods alive until one succeeds, as Kubernetes does), which the test
scales up and whose first pod it deletes (tests/scripts/k8s_elastic.py)."""
from __future__ import annotations

import json
import os
import secrets as pysecrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SCRIPTS
from test_k8s import K8S_VERSIONS, generate, pod_env

sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos_job import reference  # noqa: E402  (the elastic scripts' least squares, one process)

from byteps.launcher import free_port, k8s

yaml = pytest.importorskip("yaml")


def test_elastic_manifests_validate_and_scale():
    kv = pytest.importorskip("kubernetes_validate")
    docs = generate("--min-workers", "2", "--max-workers", "5", "--gpus-per-worker", "1",
                    "--servers", "2", "--image", "registry.example.com/byteps:cuda",
                    "--elastic-timeout", "120", "--", "python", "train.py")
    assert [d["kind"] for d in docs] == ["Secret", "NetworkPolicy", "Service", "Pod", "Job",
                                         "Job"]
    for version in K8S_VERSIONS:
        for d in docs:
            kv.validate(d, version, strict=True)
    servers, workers = docs[4], docs[5]
    assert servers["spec"]["completionMode"] == "Indexed"      # servers stay a fixed set
    spec = workers["spec"]
    # scalable: parallelism (kubectl patch), no completions, no completion index
    assert spec["completionMode"] == "NonIndexed" and spec["parallelism"] == 2
    assert "completions" not in spec and spec["backoffLimit"] == 50
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"          # a lost pod is replaced by a new one
    c = pod["containers"][0]
    assert c["args"] == ["--local-size", "1", "python", "train.py"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "DMLC_WORKER_ID" not in env              # ranks come from the scheduler
    assert env["DMLC_NUM_WORKER"] == "2" and env["BYTEPS_MIN_WORKERS"] == "2"
    assert env["BYTEPS_MAX_WORKERS"] == "5" and env["BYTEPS_ELASTIC_TIMEOUT"] == "120"
    sched = {e["name"]: e.get("value") for e in docs[3]["spec"]["containers"][0]["env"]}
    assert sched["BYTEPS_MIN_WORKERS"] == "2" and sched["BYTEPS_MAX_WORKERS"] == "5"
    # --workers: the initial parallelism, between the bounds
    docs = generate("--min-workers", "2", "--max-workers", "4", "--workers", "3",
                    "--servers", "1", "--image", "i", "--", "python", "t.py")
    assert docs[-1]["spec"]["parallelism"] == 3 and docs[-1]["spec"]["backoffLimit"] == 40


@pytest.mark.parametrize("args, text", [
    (["--min-workers", "3", "--max-workers", "2"], "--max-workers 2 is below --min-workers 3"),
    (["--min-workers", "2", "--workers", "5", "--max-workers", "4"], "must lie between"),
    (["--max-workers", "4", "--workers", "2"], "need --min-workers N"),
    (["--min-workers", "2", "--gpus-per-worker", "8"], "one worker process each"),
    (["--min-workers", "2", "--elastic-timeout", "0"], "--elastic-timeout must be > 0"),
    ([], "--workers is required"),
])
def test_bad_elastic_options_are_one_line(args, text, capsys):
    with pytest.raises(SystemExit) as e:
        k8s.options([*args, "--servers", "1", "--image", "i", "--", "python", "t.py"])
    assert e.value.code == 2 and text in capsys.readouterr().err


# ------------------------------------------------------------------ running the pods


class Pods:
    """Pods as local processes: each in its own session (a pod), the kubelet's
    environment from the manifest, output in LOG_DIR/<pod>.log."""

    def __init__(self, docs: list[dict], log_dir: Path):
        self.secrets = {d["metadata"]["name"]: d["stringData"] for d in docs
                        if d["kind"] == "Secret"}
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, container: dict, index: int | None) -> subprocess.Popen:
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
               "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(ROOT),
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.update(pod_env({"container": container, "index": index}, "127.0.0.1",
                           self.secrets))
        if env["DMLC_PS_ROOT_URI"].endswith("-scheduler"):    # the Service: loopback here
            env["DMLC_PS_ROOT_URI"] = "127.0.0.1"
        with open(self.log_dir / f"{name}.log", "w") as log:
            p = subprocess.Popen(container["command"] + container["args"], env=env, cwd=ROOT,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def delete(self, name: str, grace: float = 5.0) -> None:
        """kubectl delete pod: SIGTERM to the container's first process, SIGKILL to all
        of the pod after the grace period."""
        p = self.procs[name]
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()

    def logs(self) -> str:
        return "\n".join(f"=== {n} (exit {p.returncode})\n"
                         + (self.log_dir / f"{n}.log").read_text()[-3000:]
                         for n, p in self.procs.items())


STEPS = 60


@pytest.mark.timeout(240)
def test_elastic_pods_scale_up_lose_a_pod_and_finish_exact(tmp_path):
    """2 worker pods start the job; at step 20 parallelism goes to 3 and the new pod is let
    in at the next commit; at step 40 the pod of rank 0 is deleted: the survivors re-form as
    ranks 0 and 1 and the controller's replacement pod joins as rank 2 (a new worker, not
    the deleted one's ordinal or rank; at step 45's commit, or in the same re-formation
    when it registered before the loss was noticed).  Every step's sums match that step's
    membership and the model equals one process's run."""
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    docs = generate("--name", "el", "--min-workers", "2", "--max-workers", "3", "--servers",
                    "1", "--image", "byteps:cpu", "--port", str(free_port()),
                    "--elastic-timeout", "60", "-x", "BYTEPS_ENABLE_IPC=0",
                    "-x", "BYTEPS_HEARTBEAT_INTERVAL=0.2", "--", "python",
                    str(SCRIPTS / "k8s_elastic.py"), str(out), str(STEPS))
    sched_pod = next(d for d in docs if d["kind"] == "Pod")
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    wjob = jobs["el-workers"]
    wc = wjob["spec"]["template"]["spec"]["containers"][0]
    pods = Pods(docs, logs)
    workers: list[str] = []
    try:
        sched = pods.start("el-scheduler", sched_pod["spec"]["containers"][0], None)
        sjob = jobs["el-servers"]
        for i in range(sjob["spec"]["completions"]):
            pods.start(f"el-servers-{i}", sjob["spec"]["template"]["spec"]["containers"][0], i)
        parallelism = wjob["spec"]["parallelism"]
        deleted = None
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            done = [pods.procs[n].poll() for n in workers]
            alive = sum(1 for c in done if c is None)
            if 0 not in done:       # the Job controller: no new pod once one succeeded
                for _ in range(parallelism - alive):
                    name = f"el-workers-{pysecrets.token_hex(3)[:5]}"
                    pods.start(name, wc, None)
                    workers.append(name)
            if parallelism == 2 and (out / "grow").exists():
                parallelism = 3                 # kubectl patch job el-workers parallelism=3
            if deleted is None and (out / "delete").exists():
                pid = int((out / "delete").read_text())     # kubectl delete pod <rank 0's>
                deleted = next(n for n in workers if pods.procs[n].pid == pid)
                pods.delete(deleted)
            if all(p.poll() is not None for p in pods.procs.values()):
                break
            time.sleep(0.1)
        if any(p.poll() is None for p in pods.procs.values()):
            pytest.fail(f"the job did not end within 200 s\n{pods.logs()}")
    finally:
        pods.kill_all()
    text = pods.logs()
    assert sched.returncode == 0 and pods.procs["el-servers-0"].returncode == 0, text
    assert deleted is not None and len(workers) == 4, text
    assert pods.procs[deleted].returncode != 0, text
    assert deleted in workers[:2] and workers[2] != deleted, text
    assert all(pods.procs[n].returncode == 0 for n in workers if n != deleted), text
    ranks = {}
    for f in out.glob("rank*.json"):
        doc = json.loads(f.read_text())
        ranks[doc["rank"]] = doc
    assert sorted(ranks) == [0, 1, 2], text
    # pods -> final ranks: the first two pods' survivor (it was rank 1), the scale-up
    # pod, the replacement: dense, in the scheduler's order, no pod ordinal involved
    by_pod = {pods.procs[n].pid: n for n in workers}
    survivor = next(n for n in workers[:2] if n != deleted)
    assert [by_pod[ranks[r]["ppid"]] for r in (0, 1, 2)] == [survivor, *workers[2:]], text
    # the replacement joins at step 45's commit, or already in the re-formation of step 40
    # (it registered before the loss was noticed: held at --max-workers, then let in)
    resets = ranks[0]["resets"]
    assert resets in ([[20, 1, 3], [40, 0, 2], [45, 0, 3]], [[20, 1, 3], [40, 0, 3]]), resets
    sizes = {0: 2, **{step: size for step, _rank, size in resets}}

    def size_at(step):
        return sizes[max(s for s in sizes if s <= step)]
    for r, first in ((0, 0), (1, 20), (2, resets[-1][0])):
        steps = [c[0] for c in ranks[r]["checked"]]
        assert steps == list(range(first, STEPS)), (r, steps)
        assert all(c[2] == size_at(c[0]) for c in ranks[r]["checked"]), ranks[r]["checked"]
    got = [np.array(ranks[r]["w"], np.float32) for r in (0, 1, 2)]
    assert all(np.array_equal(g, got[0]) for g in got)
    np.testing.assert_allclose(got[0], reference(STEPS), rtol=1e-4, atol=1e-5)


def test_scheduler_holds_a_pod_over_max_until_a_loss_frees_its_place(monkeypatch):
    """A deleted pod's replacement may register before the scheduler notices the loss: at
    --max-workers it is held (not refused), and the loss lets it into the re-formed group."""
    from test_elastic import _books, _close, _reg, _scheduler

    from byteps.transport.wire import Op
    s = _scheduler(monkeypatch, workers=2, min=2, max=2)
    try:
        _reg(s, b"srv", "server", "s0", 10)
        _reg(s, b"a", "worker", "podA", 100)
        _reg(s, b"b", "worker", "podB", 101)
        assert s.formed
        s.sent.clear()
        _reg(s, b"c", "worker", "podC", 102)                # the replacement, early
        assert not [1 for _i, op, _b in s.sent if op in (Op.REFUSED, Op.ELASTIC)]
        assert b"c" in s.elastic.parked
        s.fail("pod A deleted", dead=dict(s.workers[b"a"], role="worker"))
        assert s.exit_code is None and not s.elastic.parked and b"c" in s.elastic.waiting
        _reg(s, b"b2", "worker", "podB", 101)               # the survivor after its reset
        books = _books(s)
        assert {i: b["rank"] for i, b in books.items() if b["rank"] >= 0} == \
            {b"b2": 0, b"c": 1} and s.epoch == 2
    finally:
        _close(s)

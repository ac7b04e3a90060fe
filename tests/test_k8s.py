"""``bpslaunch k8s``: the manifests validate against the Kubernetes OpenAPI schemas, and
they really run: each pod's command and environment, read from the manifests, is started
as a process (on loopback, and as root in its own network namespace with the Service
name in its hosts file), and the job trains the digits example."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, job_env

from byteps.launcher import free_port, k8s
from byteps.launcher.yaml_out import dump, scalar

yaml = pytest.importorskip("yaml")
K8S_VERSIONS = ("1.30.0", "1.37.0")      # schemas shipped by kubernetes-validate==1.37.0


def generate(*args: str) -> list[dict]:
    """The manifests bpslaunch k8s prints, after the Secret it wrote to its own file (run
    in a fresh folder: the secret file's default place)."""
    with tempfile.TemporaryDirectory() as here:
        res = subprocess.run([sys.executable, "-m", "byteps.launcher", "k8s", *args],
                             capture_output=True, text=True, timeout=60, cwd=here,
                             env=job_env(), check=False)
        assert res.returncode == 0, res.stderr
        files = sorted(Path(here).glob("*-secret.yaml"))
        secret = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    return secret + [d for d in yaml.safe_load_all(res.stdout) if d]


def test_the_generated_secret_never_reaches_stdout(tmp_path):
    """The secret goes to a file of mode 0600 (said on stderr); stdout only refers to the
    Secret by name; an existing file is kept, so the job's secret stays the same."""
    args = [sys.executable, "-m", "byteps.launcher", "k8s", "--workers", "1", "--servers",
            "1", "--image", "i", "--name", "job-s", "--", "python", "t.py"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=job_env(), check=False)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "job-s-secret.yaml"
    assert (path.stat().st_mode & 0o777) == 0o600
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    value = doc["stringData"]["BYTEPS_JOB_SECRET"]
    assert doc["kind"] == "Secret" and len(value) == 64
    assert value not in res.stdout and "kind: Secret" not in res.stdout
    assert str(path) in res.stderr and "kubectl apply -f job-s-secret.yaml" in res.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=job_env(), check=False)
    assert again.returncode == 0 and "kept the existing" in again.stderr
    assert value in path.read_text()
    other = subprocess.run(args[:-3] + ["--secret-file", str(tmp_path / "no" / "s.yaml"),
                                        "--", "python", "t.py"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=job_env(), check=False)
    assert other.returncode == 2 and "cannot write the job secret" in other.stderr


def test_yaml_emitter_round_trips():
    doc = {"a": [1, "2", "true", "no", None, True, "x y", "#c", "", {"b": []}, [1, [2]]],
           "c": {}, "d": "line\nbreak", "e": 1.5, "f": "1Gi", "g": "-x", "h": ":"}
    assert yaml.safe_load(dump(doc)) == doc
    assert scalar("python") == "python" and scalar("8") == '"8"'


def test_manifests_validate_against_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    docs = generate("--workers", "4", "--gpus-per-worker", "8", "--servers", "4",
                    "--image", "registry.example.com/byteps:cuda", "--namespace", "ml",
                    "-x", "NCCL_DEBUG=INFO", "--", "python", "train.py", "--epochs", "3")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Secret", "NetworkPolicy", "Service", "Pod", "Job", "Job"]
    for version in K8S_VERSIONS:
        for d in docs:
            kv.validate(d, version, strict=True)       # raises ValidationError
    secret, policy, service, _pod, servers, workers = docs
    assert len(secret["stringData"]["BYTEPS_JOB_SECRET"]) == 64
    assert service["spec"]["clusterIP"] == "None"
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {
        "matchLabels": {"byteps.io/job": "byteps"}}}]}]
    wspec = workers["spec"]
    assert wspec["completionMode"] == "Indexed" and wspec["completions"] == 4
    c = wspec["template"]["spec"]["containers"][0]
    assert c["args"] == ["--local-size", "8", "python", "train.py", "--epochs", "3"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e for e in c["env"]}
    assert env["DMLC_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["BYTEPS_JOB_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "byteps-secret"
    assert env["DMLC_NUM_WORKER"]["value"] == "4" and env["NCCL_DEBUG"]["value"] == "INFO"
    vol = wspec["template"]["spec"]["volumes"][0]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "9Gi"}
    assert servers["spec"]["completions"] == 4
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)


def test_existing_secret_and_no_policy():
    docs = generate("--workers", "1", "--servers", "1", "--image", "i", "--secret-name",
                    "mine", "--no-network-policy", "--name", "job-a", "--", "python", "t.py")
    assert [d["kind"] for d in docs] == ["Service", "Pod", "Job", "Job"]
    env = {e["name"]: e for e in docs[1]["spec"]["containers"][0]["env"]}
    assert env["BYTEPS_JOB_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "mine"


@pytest.mark.parametrize("args, text", [
    (["--workers", "0", "--servers", "1"], "--workers must be >= 1"),
    (["--workers", "1", "--servers", "1", "--name", "Bad_Name"], "DNS label"),
    (["--workers", "1", "--servers", "1", "-x", "NOEQ"], "KEY=VALUE"),
])
def test_bad_options_are_one_line(args, text, capsys):
    with pytest.raises(SystemExit) as e:
        k8s.options([*args, "--image", "i", "--", "python", "t.py"])
    assert e.value.code == 2 and text in capsys.readouterr().err


# ------------------------------------------------------------------ running the pods
def pods(docs: list[dict]) -> list[dict]:
    """Every pod the manifests describe: name, container, completion index."""
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append({"name": d["metadata"]["name"], "index": None,
                        "container": d["spec"]["containers"][0]})
        elif d["kind"] == "Job":
            for i in range(d["spec"]["completions"]):
                out.append({"name": f"{d['metadata']['name']}-{i}", "index": i,
                            "container": d["spec"]["template"]["spec"]["containers"][0]})
    return out


def pod_env(pod: dict, ip: str, secrets: dict[str, dict]) -> dict[str, str]:
    """What the kubelet would give the container: values, Secret keys, the downward API."""
    env = {}
    for e in pod["container"]["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            path = src["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                env[e["name"]] = ip
            elif path == "metadata.annotations['batch.kubernetes.io/job-completion-index']":
                env[e["name"]] = str(pod["index"])
            else:
                raise AssertionError(f"unexpected fieldRef {path}")
    return env


def run_pods(docs: list[dict], launch, timeout: float, log_dir: Path) -> dict[str, str]:
    """Start every pod with ``launch(pod, env) -> argv``; wait for all; return outputs."""
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    procs = {}
    try:
        for pod in pods(docs):
            c = pod["container"]
            base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                    "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(ROOT),
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            argv, env = launch(pod, base, secrets)
            log = open(log_dir / f"{pod['name']}.log", "w")  # noqa: SIM115
            procs[pod["name"]] = (subprocess.Popen(argv + c["command"] + c["args"], env=env,
                                                   cwd=ROOT, stdout=log,
                                                   stderr=subprocess.STDOUT), log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs.values()):
            time.sleep(0.2)
    finally:
        for p, log in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            log.close()
    outs = {n: (log_dir / f"{n}.log").read_text() for n in procs}
    codes = {n: p.returncode for n, (p, _) in procs.items()}
    assert all(c == 0 for c in codes.values()), (codes, outs)
    return outs


def assert_trained(outs: dict[str, str]) -> None:
    accs = [float(a) for a in re.findall(r"test_acc=([0-9.]+)", outs["digits-workers-0"])]
    assert accs and accs[-1] >= 0.95, outs["digits-workers-0"]


def digits_job(port: int) -> list[dict]:
    return generate("--name", "digits", "--workers", "2", "--servers", "2", "--image",
                    "byteps:cpu", "--port", str(port), "-x", "BYTEPS_ENABLE_IPC=0", "--",
                    "python", "examples/torch/train_digits.py")


@pytest.mark.timeout(200)
def test_manifests_run_as_local_processes(tmp_path):
    """The pods' commands and environment as plain processes on loopback (the Service
    name replaced by 127.0.0.1)."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    docs = digits_job(free_port())

    def launch(pod, base, secrets):
        env = dict(base, **pod_env(pod, "127.0.0.1", secrets))
        if env["DMLC_PS_ROOT_URI"] == "digits-scheduler":
            env["DMLC_PS_ROOT_URI"] = "127.0.0.1"
        return [], env
    assert_trained(run_pods(docs, launch, 170, tmp_path))


@pytest.mark.timeout(240)
def test_manifests_run_one_network_namespace_per_pod(tmp_path):
    """Each pod in its own network namespace; the scheduler's Service name resolves through
    the namespace's hosts file, as cluster DNS would resolve the headless Service."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import podnet
    why = podnet.skip_reason()
    if why:
        pytest.skip(why)
    docs = digits_job(9000)
    names = [p["name"] for p in pods(docs)]
    with podnet.PodNet(names, aliases={"digits-scheduler": "digits-scheduler"}) as net:
        def launch(pod, base, secrets):
            env = dict(base, **pod_env(pod, net.ip[pod["name"]], secrets))
            return net.argv(pod["name"], env, []), None
        outs = run_pods(docs, launch, 200, tmp_path)
    assert_trained(outs)

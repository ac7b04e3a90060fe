"""horovodrun's command line on bpslaunch (byteps/launcher/horovodrun.py): its names for
bpslaunch's options, its tuning options as the HOROVOD_* variables horovodrun sets, notes
for what has no effect, refusals with the reason, --check-build.  Real jobs through the
installed ``bpslaunch``, each with a timeout."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BPSLAUNCH_CLI, ROOT, SCRIPTS, job_env

pytestmark = pytest.mark.timeout(120)


def launch(*args, timeout: float = 90) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(BPSLAUNCH_CLI + [str(a) for a in args], env=job_env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bpslaunch timed out after {timeout} s\n{exc.stdout}\n{exc.stderr}")


def test_a_horovodrun_command_line_runs(tmp_path):
    """horovodrun's options, as a Horovod user writes them, set the workers' config; the
    timeline file it names is written by rank 0; --gloo is noted, not refused."""
    tl = tmp_path / "timeline.json"
    res = launch("--num-proc", 2, "--hosts", "localhost:2", "--gloo",
                 "--timeline-filename", tl, "--timeline-mark-cycles",
                 "--fusion-threshold-mb", 0, "--autotune-steps-per-sample", 4,
                 "--stall-check-warning-time-seconds", 30, "--log-level", "INFO",
                 "--no-hierarchical-allreduce",
                 sys.executable, SCRIPTS / "hvdrun_env.py", tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "bpslaunch: horovodrun's --gloo has no effect: byteps has one controller" \
        in res.stderr
    docs = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(docs) == [0, 1]
    for d in docs.values():
        assert (d["size"], d["local_size"], d["sum"]) == (2, 2, [2.0, 2.0])   # -H's host
        assert (d["timeline"], d["marks"], d["fusion"]) == (str(tl), True, 0)
        assert (d["autotune_steps"], d["stall_warning_s"]) == (4, 30.0)
        assert d["env"]["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    rows = [e["args"]["name"] for e in json.loads(tl.read_text())
            if e["ph"] == "M" and e["name"] == "process_name" and "name" in e["args"]]
    assert "allreduce.x" in rows
    # rank 0 logs what each HOROVOD_* variable became (INFO)
    assert "HOROVOD_FUSION_THRESHOLD=0 -> BYTEPS_FUSION_BYTES=0" in res.stderr, res.stderr


@pytest.mark.parametrize("args,why", [
    (("--mpi-args", "-x FOO"), "there is no mpirun"),
    (("--output-filename", "/tmp/out"), "--log-dir DIR"),
    (("--reset-limit", "3"), "BYTEPS_ELASTIC_TIMEOUT"),
    (("--hosts", "a:2", "-H", "b:2"), "give the host list once"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(args, why):
    res = launch("-np", 2, *args, "true", timeout=30)
    assert res.returncode == 2, res.stderr
    assert why in res.stderr.strip().splitlines()[-1], res.stderr


def test_check_build_and_aliases():
    assert launch("-v", timeout=30).stdout.startswith("bpslaunch ")    # horovodrun's -v
    res = launch("--check-build", timeout=30)
    assert res.returncode == 0 and "Available Frameworks:" in res.stdout, res
    assert "    [X] PyTorch" in res.stdout and "    [X] byteps scheduler" in res.stdout
    from byteps.launcher import parser
    a = parser().parse_args(["-np", "4", "--min-np", "2", "--max-np", "6", "-p", "2222",
                             "-i", "/k", "-hostfile", "hf", "--network-interfaces", "eth1",
                             "true"])
    assert (a.num_workers, a.min_workers, a.max_workers, a.ssh_port) == (4, 2, 6, 2222)
    assert (a.ssh_identity_file, a.hostfile, a.network_interface) == ("/k", "hf", "eth1")


def test_slots_per_host_fills_hosts_listed_without_slots(tmp_path):
    """horovodrun's --slots-per-host: a discovered ``host`` line without ``:slots`` has that
    many slots (the discovery script really runs)."""
    from byteps.launcher import parser
    from byteps.launcher.elastic import Discovery
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho gpu1\necho gpu2:2\n")
    script.chmod(0o755)
    a = parser().parse_args(["--min-np", "2", "--host-discovery-script", str(script),
                             "--slots-per-host", "4", "true"])
    disco = Discovery(a.host_discovery_script, 1.0, a.slots_per_host)
    assert disco.poll(0.0) == 6 and disco.hosts == {"gpu1": 4, "gpu2": 2}
    assert Discovery(str(script), 1.0).poll(0.0) == 3           # horovodrun's default: 1
    res = launch("-np", 1, "--min-np", 1, "--slots-per-host", 0, "true", timeout=30)
    assert res.returncode == 2 and "--slots-per-host must be >= 1" in res.stderr, res.stderr

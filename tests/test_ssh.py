"""``bpslaunch -H`` / ``--hostfile``: a job on several machines over ssh (issue 15).

Pure logic (host lists, host files, the layout, -x); a loopback run through a fake
``ssh`` (runs the remote command here: the bootstrap protocol without root); and as
root, machines as network namespaces each running a real sshd (tests/sshd.py) with
bpslaunch in a "login" namespace: training, SIGKILL of a remote worker, Ctrl-C, an
unreachable host.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BPSLAUNCH, ROOT, SCRIPTS, job_env, read_results

from byteps.launcher.ssh import Host, HostsError, parse_hosts, plan, read_hostfile

PY = sys.executable


# ------------------------------------------------------------------ pure logic
def test_host_lists_and_files(tmp_path):
    assert parse_hosts("h1:4,h2:4") == [Host("h1", 4), Host("h2", 4)]
    assert parse_hosts("root@gpu1, 10.0.0.2:2") == [Host("root@gpu1", 1), Host("10.0.0.2", 2)]
    for bad in ("h1:0", "h1:x", ":3", ","):
        with pytest.raises(HostsError):
            parse_hosts(bad)
    f = tmp_path / "hosts"
    f.write_text("# workers\ngpu1 slots=8\n\ngpu2 slots=8 max_slots=8  # second\n")
    assert read_hostfile(str(f)) == [Host("gpu1", 8), Host("gpu2", 8)]
    f.write_text("gpu1 slot=8\n")
    with pytest.raises(HostsError, match="line 1: cannot read 'slot=8'"):
        read_hostfile(str(f))


def test_layout_follows_slurm():
    roles = plan(parse_hosts("h1:2,h2:2"))
    assert [(r.tag, r.host) for r in roles] == [
        ("scheduler", "h1"), ("server 0", "h1"), ("server 1", "h2"),
        ("worker 0", "h1"), ("worker 1", "h1"), ("worker 2", "h2"), ("worker 3", "h2")]
    assert [(r.worker_id, r.local_rank) for r in roles[3:]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    roles = plan(parse_hosts("h1:1,h2:1"), ["c1", "c2"], num_servers=5, scheduler_host="c1")
    assert roles[0].host == "c1"
    assert [(r.index, r.host) for r in roles if r.kind == "server"] == [
        (0, "c1"), (1, "c2"), (2, "c1"), (3, "c2"), (4, "c1")]
    with pytest.raises(HostsError, match="same number of slots"):
        plan(parse_hosts("h1:2,h2:1"))
    with pytest.raises(HostsError, match="named twice"):
        plan(parse_hosts("h1:2,h1:2"))


def test_usage_errors_are_one_line(tmp_path):
    for args, msg in ((["-H", "h1:2,h2:1"], "same number of slots"),
                      (["-H", "h1", "-x", "NO_SUCH_VAR_X"], "-x NO_SUCH_VAR_X: not set here"),
                      (["-H", "h1", "--hostfile", "f"], "give one")):
        res = subprocess.run(BPSLAUNCH + args + [PY, "-c", "pass"], env=job_env(), cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 2 and msg in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


# ------------------------------------------------------------------ fake ssh on loopback
FAKE_SSH = """#!/bin/sh
# ssh [options] -- HOST COMMAND: run COMMAND here, as sshd would through the login shell,
# in a fresh login environment (only what bpslaunch forwards reaches the processes)
while [ "$1" != "--" ]; do shift; done
shift; shift
exec env -i HOME="$HOME" PATH=/usr/bin:/bin SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22" \\
    sh -c "$*"
"""


@pytest.mark.timeout(120)
def test_fake_ssh_on_loopback_ranks_tags_logs(tmp_path):
    """Two "hosts" of 2 workers whose ssh runs the remote command on this machine: ranks
    follow the host order, every line is tagged, --log-dir has one file per process, and
    the secret bpslaunch made reaches the processes (they authenticate each other); the
    login gets bpslaunch's environment as Horovod forwards it (PYTHONPATH and any other
    variable, no *CUDA_VISIBLE_DEVICES), MASTER_ADDR/MASTER_PORT of the first host, and
    every worker's summary comes back."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    env = job_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", BYTEPS_ENABLE_IPC=0,
                  FORWARD_ME="yes", CUDA_VISIBLE_DEVICES="7")
    res = subprocess.run(BPSLAUNCH + ["-H", "a:2,b:2", "--log-dir", str(logs), PY,
                                      str(SCRIPTS / "rank_env.py"), str(out)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=100,
                         check=False)
    assert res.returncode == 0, res.stderr
    docs = read_results(out)
    assert sorted(docs) == [0, 1, 2, 3]
    for rank, d in docs.items():
        assert (d["size"], d["local_rank"], d["env"]["NODE_RANK"]) == (4, rank % 2,
                                                                       str(rank // 2))
        assert d["other"]["FORWARD_ME"] == "yes" and d["other"]["CUDA_VISIBLE_DEVICES"] is None
        assert d["other"]["MASTER_ADDR"] == "127.0.0.1" and d["other"]["MASTER_PORT"]
    for rank in range(4):
        assert f"bpslaunch: worker rank {rank} (host " in res.stderr, res.stderr
    tagged = re.findall(r"^\[worker (\d)\] RANKENV ", res.stdout, re.MULTILINE)
    assert sorted(tagged) == ["0", "1", "2", "3"], res.stdout
    assert sorted(p.name for p in logs.iterdir()) == [
        "scheduler.log", "server-0.log", "server-1.log",
        "worker-0.log", "worker-1.log", "worker-2.log", "worker-3.log"]
    assert (logs / "worker-2.log").read_text().startswith("RANKENV ")


# ------------------------------------------------------------------ local slots, no ssh
def test_this_machine_is_local():
    import socket

    from byteps.launcher.hosts import is_local
    for name in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        assert is_local(name), name
    for name in ("h1", "root@localhost", "192.0.2.1", "gpu1:8"):
        assert not is_local(name), name


@pytest.mark.timeout(120)
def test_local_slots_start_without_ssh(tmp_path):
    """-H localhost:2 with an ssh that only fails: the job runs (no sshd, no ssh), local
    ranks 0 and 1, tagged lines, torch's rendezvous on loopback, and the summaries."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text("#!/bin/sh\necho ssh was called >&2\nexit 255\n")
    (bindir / "ssh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = job_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    res = subprocess.run(BPSLAUNCH + ["-H", "localhost:2", PY, str(SCRIPTS / "rank_env.py"),
                                      str(out)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=100, check=False)
    assert res.returncode == 0, res.stderr
    assert "ssh was called" not in res.stderr and "started without ssh" in res.stderr
    docs = read_results(out)
    assert sorted(docs) == [0, 1]
    for rank, d in docs.items():
        assert (d["local_rank"], d["local_size"], d["size"]) == (rank, 2, 2)
        assert d["other"]["MASTER_ADDR"] == "127.0.0.1"
        assert f"bpslaunch: worker rank {rank} (host " in res.stderr, res.stderr
    assert sorted(re.findall(r"^\[worker (\d)\] RANKENV ", res.stdout, re.MULTILINE)) == \
        ["0", "1"], res.stdout
    res = subprocess.run(BPSLAUNCH + ["-H", "localhost:2", "-np", "3", "true"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "-np 3 does not match the 2 slot(s)" in res.stderr


# ------------------------------------------------------------------ sshd in namespaces
HOSTS = ("h1", "h2", "h3", "h4")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Namespaces login, h1..h4 on one bridge, a real sshd in each of h1..h4; "h5" names an
    address where no machine answers."""
    import sshd
    why = sshd.skip_reason()
    if why:
        pytest.skip(why)
    import podnet
    keys = sshd.SshKeys(tmp_path_factory.mktemp("keys"))
    with podnet.PodNet(["login", *HOSTS]) as net:
        with open(f"/etc/netns/{net.ns['login']}/hosts", "a") as f:
            f.write(f"{podnet.SUBNET}.99 h5\n")
        daemons = {h: sshd.start_sshd(net, h, keys) for h in HOSTS}
        net.keys, net.daemons = keys, daemons
        try:
            yield net
        finally:
            for p in daemons.values():
                p.kill()
                p.wait()


def _launch(net, tmp_path, args: list[str], **env) -> subprocess.Popen:
    argv = [*BPSLAUNCH, "--ssh-config", str(net.keys.ssh_config), "--ssh-identity-file",
            str(net.keys.identity), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", *args]
    e = dict(job_env(**env), PYTHONUNBUFFERED="1")
    return subprocess.Popen(net.argv("login", e, argv), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _left(net) -> dict[str, list[str]]:
    """Processes still running on h1..h4 besides their sshd: {host: [command lines]}."""
    out = {}
    for h in HOSTS:
        rest = []
        for pid in net.pids(h):
            if pid == net.daemons[h].pid:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                rest.append(f"{pid}: {cmd.strip()}")
        if rest:
            out[h] = rest
    return out


def _wait_gone(net, within: float) -> None:
    deadline = time.monotonic() + within
    while _left(net) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _left(net) == {}, f"left running: {_left(net)}"


def _finish(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"bpslaunch did not end:\n{out[-3000:]}\n{err[-3000:]}")


@pytest.mark.timeout(300)
def test_digits_over_ssh_with_server_hosts(cluster, tmp_path):
    """-H h1:2,h2:2 --server-hosts h3,h4: the digits example reaches 95 %; every line is
    tagged; one log file per process; nothing is left on any host."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    logs = tmp_path / "logs"
    p = _launch(cluster, tmp_path, ["-H", "h1:2,h2:2", "--server-hosts", "h3,h4",
                                    "--log-dir", str(logs), PY,
                                    str(ROOT / "examples/torch/train_digits.py")])
    out, err = _finish(p, 260)
    assert p.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    accs = [float(a) for a in re.findall(r"^\[worker 0\] .*test_acc=([0-9.]+)", out, re.MULTILINE)]
    assert accs and accs[-1] >= 0.95, out
    for line in out.splitlines() + err.splitlines():
        assert re.match(r"\[(worker \d|server \d|scheduler)\] |bpslaunch: ", line), line
    assert sorted(x.name for x in logs.iterdir()) == [
        "scheduler.log", "server-0.log", "server-1.log",
        "worker-0.log", "worker-1.log", "worker-2.log", "worker-3.log"]
    assert "test_acc=" in (logs / "worker-0.log").read_text()
    _wait_gone(cluster, 10)


def _start_forever(net, tmp_path, secret: str) -> subprocess.Popen:
    p = _launch(net, tmp_path, ["-H", "h1:2,h2:2", "--server-hosts", "h3,h4", PY,
                                str(SCRIPTS / "sigint_worker.py"), str(tmp_path)],
                BYTEPS_JOB_SECRET=secret)
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("ready.rank*"))) < 4:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            pytest.fail("the job did not start:\n" + "\n".join(x[-3000:] for x in p.communicate()))
        time.sleep(0.2)
    return p


def _no_secret_in_command_lines(secret: str) -> None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                assert secret.encode() not in Path(f"/proc/{d}/cmdline").read_bytes(), d
            except OSError:
                pass


@pytest.mark.timeout(200)
def test_sigkill_of_a_remote_worker_ends_every_process_on_every_host(cluster, tmp_path):
    secret = "5ec" + "7" * 61
    p = _start_forever(cluster, tmp_path, secret)
    _no_secret_in_command_lines(secret)
    pid = int((tmp_path / "ready.rank3").read_text())
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _out, err = _finish(p, 30)
    _wait_gone(cluster, max(0.1, 10 - (time.monotonic() - t0)))
    assert time.monotonic() - t0 < 10
    assert p.returncode == 137, err[-3000:]
    assert "root cause: worker 3 on h2" in err.strip().splitlines()[-1], err[-3000:]


@pytest.mark.timeout(200)
def test_ctrl_c_reaches_remote_workers_as_keyboard_interrupt(cluster, tmp_path):
    p = _start_forever(cluster, tmp_path, "c" * 64)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _out, err = _finish(p, 30)
    _wait_gone(cluster, max(0.1, 10 - (time.monotonic() - t0)))
    assert p.returncode == 130, err[-3000:]
    assert sorted(x.name for x in tmp_path.glob("interrupted.rank*")) == [
        f"interrupted.rank{r}" for r in range(4)]
    assert "job interrupted (SIGINT): 4 of 4 worker(s)" in err, err[-3000:]


@pytest.mark.timeout(200)
def test_sigkill_of_bpslaunch_leaves_nothing_on_any_host(cluster, tmp_path):
    """No orphans even when bpslaunch cannot clean up: its ssh clients die with it, every
    session's input ends and each bootstrap ends its process group."""
    p = _start_forever(cluster, tmp_path, "d" * 64)
    t0 = time.monotonic()
    p.kill()
    p.communicate(timeout=30)
    _wait_gone(cluster, max(0.1, 10 - (time.monotonic() - t0)))


@pytest.mark.timeout(120)
def test_unreachable_host_is_one_line_within_the_connect_timeout(cluster, tmp_path):
    t0 = time.monotonic()
    p = _launch(cluster, tmp_path, ["-H", "h1:1,h5:1", "--ssh-connect-timeout", "3", PY,
                                    "-c", "pass"])
    _out, err = _finish(p, 60)
    took = time.monotonic() - t0
    assert p.returncode == 255, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bpslaunch: host h5: cannot reach it"), err
    assert took < 3 + 5, took
    _wait_gone(cluster, 1)

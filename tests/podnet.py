"""Network namespaces as machines for the deployment tests (Kubernetes pods, Slurm nodes,
ssh hosts): one namespace per machine on one bridge, names resolved through each
namespace's hosts file (``ip netns exec`` bind-mounts ``/etc/netns/NS/hosts`` over
``/etc/hosts``).  Needs root and iproute2; ``skip_reason()`` says why not otherwise.

    with PodNet(["sched", "server-0", "worker-0"], aliases={"job-scheduler": "sched"}) as net:
        p = subprocess.Popen(net.argv("worker-0", env, ["python", "train.py"]))
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time

SUBNET = "10.215.0"
PREFIX = "bpsd-"


def skip_reason() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, e.g. in CI's container)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                       timeout=30, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)
    return None


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


class PodNet:
    """Machines ``names`` (10.215.0.10, .11, ...) on one bridge; ``aliases`` are extra host
    names (a Service) pointing at a machine's address."""

    def __init__(self, names: list[str], aliases: dict[str, str] | None = None):
        tag = f"{PREFIX}{os.getpid() % 100000}-{secrets.token_hex(2)}"
        self.switch = f"{tag}-sw"
        self.ns = {n: f"{tag}-{i}" for i, n in enumerate(names)}
        self.ip = {n: f"{SUBNET}.{10 + i}" for i, n in enumerate(names)}
        self.aliases = dict(aliases or {})
        self._made: list[str] = []

    def __enter__(self) -> PodNet:  # noqa: PYI034
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        sw = self.switch
        _run(["ip", "netns", "add", sw])
        self._made.append(sw)
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        hosts = ["127.0.0.1 localhost"]
        hosts += [f"{self.ip[n]} {n}" for n in self.ns]
        hosts += [f"{self.ip[target]} {alias}" for alias, target in self.aliases.items()]
        for i, (name, ns) in enumerate(self.ns.items()):
            _run(["ip", "netns", "add", ns])
            self._made.append(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                  f"p{i}", "netns", sw])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", sw, "link", "set", f"p{i}", "master", "br0"])
            _run(["ip", "-n", sw, "link", "set", f"p{i}", "up"])
            etc = f"/etc/netns/{ns}"
            os.makedirs(etc, exist_ok=True)
            with open(f"{etc}/hosts", "w") as f:
                f.write("\n".join(hosts) + "\n")

    def argv(self, name: str, env: dict[str, str], cmd: list[str]) -> list[str]:
        """Run ``cmd`` on machine ``name`` with exactly ``env``."""
        return ["ip", "netns", "exec", self.ns[name], "env", "-i",
                *[f"{k}={v}" for k, v in sorted(env.items())], *cmd]

    def pids(self, name: str) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", self.ns[name]], capture_output=True,
                           text=True, timeout=30, check=False)
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    def close(self) -> None:
        """Kill whatever still runs in the namespaces, delete them and their /etc files."""
        for ns in self._made:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                               timeout=30, check=False)
            for pid in (int(x) for x in r.stdout.split() if x.isdigit()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30,
                           check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self._made.clear()

"""Emulated hosts: Linux network namespaces on one bridge, links shaped by ``tc tbf``.

Layout of a cluster named ``<prefix>`` (prefix = ``bpsc-<pid>-<hex>``)::

    namespace <prefix>-sw       bridge br0, one port p<i> per host
    namespace <prefix>-h<i>     eth0 = 10.213.0.<10+i>/24, veth peer of p<i>

Nothing is created in the root namespace (each veth pair is made inside a
host namespace with its peer moved straight into the switch namespace), so
two clusters never collide and the host's own network is never touched.
A host's link is shaped in both directions: ``tbf`` on eth0 (upload) and on
p<i> in the switch (download).  Deleting the namespaces removes everything.
"""
from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Self

PREFIX = "bpsc-"
SUBNET = "10.213.0"
FIRST_HOST = 10
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$", re.IGNORECASE)


class NetnsError(RuntimeError):
    """The emulated cluster cannot be built (not root, no iproute2, a command failed)."""


def rate_bps(rate: str) -> float:
    """'1gbit' -> 1e9, '100mbit' -> 1e8 (bits per second, tc's decimal units)."""
    m = _RATE.match(rate.strip())
    if not m:
        raise ValueError(f"link rate {rate!r} is not understood; use e.g. 1gbit, 200mbit, "
                         f"500kbit")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[
        (m.group(2) or "").lower() or None]


# A bucket holds at least one whole TSO/GSO packet as tbf counts it (64 KiB of payload
# plus every segment's headers, about 68 KB): with a smaller one tbf cuts each such
# packet into MTU-sized ones and arms a timer for every one of them.  On this VM that
# took 75-85 % of both cores in the kernel at 200 Mbit/s (64 KiB bucket), against
# 6-15 % with 75 KB; a NIC sends a TSO packet at its line rate without any per-MTU CPU.
MIN_BURST_BYTES = 80 * 1024


def tbf_args(rate: str, latency_ms: float = 50.0, burst_ms: float = 10.0) -> list[str]:
    """tbf parameters for ``rate``: a bucket of ``burst_ms`` of traffic, at least
    MIN_BURST_BYTES (80 KiB: 3.3 ms at 200 Mbit/s, the 2 ms default from 328 Mbit/s up).

    A small bucket loses tokens whenever the qdisc's timer fires late, which
    happens on a busy 2-core host: the link then runs below its rate.  The
    average rate is enforced whatever the bucket size.
    """
    bps = rate_bps(rate)
    burst = max(int(bps / 8 * burst_ms / 1000), MIN_BURST_BYTES)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def tcp_cc_name(cc: str) -> str:
    """``cc`` if it is a congestion-control name (cubic, bbr, reno), else ValueError."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,15}", cc):
        raise ValueError(f"TCP congestion control {cc!r} is not a name like cubic or bbr")
    try:            # a namespace may only pick what the machine allows (EPERM otherwise)
        allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    except OSError:
        return cc
    if cc not in allowed:
        raise ValueError(f"TCP congestion control {cc!r} is not allowed in network namespaces "
                         f"on this machine (allowed: {' '.join(allowed)}); allow it with "
                         f"sudo sysctl -w net.ipv4.tcp_allowed_congestion_control="
                         f"'{' '.join(allowed + [cc])}'")
    return cc


@dataclasses.dataclass(frozen=True)
class Host:
    index: int
    ns: str
    ip: str
    port: str          # the bridge-side veth in the switch namespace
    dev: str = "eth0"


@dataclasses.dataclass
class Plan:
    """Names and addresses of a cluster of ``nhosts`` hosts (pure logic, no side effects)."""
    nhosts: int
    prefix: str

    def __post_init__(self):
        if not 1 <= self.nhosts <= 200:
            raise ValueError(f"an emulated cluster needs 1..200 hosts, not {self.nhosts}")
        if not self.prefix.startswith(PREFIX):
            raise ValueError(f"cluster prefix {self.prefix!r} must start with {PREFIX!r}")

    @classmethod
    def new(cls, nhosts: int) -> Plan:
        return cls(nhosts, f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}")

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def hosts(self) -> list[Host]:
        return [Host(i, f"{self.prefix}-h{i}", f"{SUBNET}.{FIRST_HOST + i}", f"p{i}")
                for i in range(self.nhosts)]

    def setup_commands(self) -> list[list[str]]:
        sw = self.switch
        cmds = [["ip", "netns", "add", sw],
                ["ip", "-n", sw, "link", "set", "lo", "up"],
                ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
                ["ip", "-n", sw, "link", "set", "br0", "up"]]
        for h in self.hosts:
            cmds += [["ip", "netns", "add", h.ns],
                     ["ip", "-n", h.ns, "link", "set", "lo", "up"],
                     ["ip", "-n", h.ns, "link", "add", h.dev, "type", "veth", "peer", "name",
                      h.port, "netns", sw],
                     ["ip", "-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", h.dev],
                     ["ip", "-n", h.ns, "link", "set", h.dev, "up"],
                     ["ip", "-n", sw, "link", "set", h.port, "master", "br0"],
                     ["ip", "-n", sw, "link", "set", h.port, "up"]]
        return cmds

    def shape_commands(self, rate: str | None, latency_ms: float = 50.0,
                       burst_ms: float = 10.0) -> list[list[str]]:
        """Replace the root qdisc of both ends of every link (None: unshaped)."""
        cmds = []
        for h in self.hosts:
            for ns, dev in ((h.ns, h.dev), (self.switch, h.port)):
                if rate is None:
                    cmds.append(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
                else:
                    cmds.append(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                                 *tbf_args(rate, latency_ms, burst_ms)])
        return cmds

    def tcp_cc_commands(self, cc: str) -> list[list[str]]:
        """Set TCP congestion control ``cc`` (cubic, bbr, reno) in every host namespace.
        A new namespace copies the machine's default, which differs between machines
        (this VM's is bbr; Linux's is cubic): on the emulated 200 Mbit/s links the raw
        TCP worker<->server mesh reached 0.175 Gbit/s with bbr and 0.14 with cubic."""
        return [["ip", "netns", "exec", h.ns, "sysctl", "-q", "-w",
                 f"net.ipv4.tcp_congestion_control={tcp_cc_name(cc)}"] for h in self.hosts]

    def teardown_commands(self) -> list[list[str]]:
        return [["ip", "netns", "del", h.ns] for h in self.hosts] + [
            ["ip", "netns", "del", self.switch]]

    def exec_prefix(self, host: Host, env: dict[str, str]) -> list[str]:
        """argv prefix that runs a command on ``host`` with exactly ``env``."""
        return ["ip", "netns", "exec", host.ns, "env", "-i",
                *[f"{k}={v}" for k, v in sorted(env.items())]]


def check_root() -> None:
    """Raise NetnsError with the fix unless we can build namespaces."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise NetnsError(f"{' and '.join(missing)} not found: install iproute2 "
                         f"(apt-get install iproute2)")
    if os.geteuid() != 0:
        raise NetnsError("the emulated cluster needs root (network namespaces, veth, tc): "
                         "run it with sudo, e.g. sudo .venv/bin/python -m "
                         "benchmarks.cluster.run ...")


def run_cmds(cmds: list[list[str]], check: bool = True) -> list[str]:
    """Run iproute2 commands; return the error lines of those that failed."""
    errors = []
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True, timeout=30,
                           check=False)
        if r.returncode != 0:
            msg = f"{' '.join(c)}: {r.stderr.strip() or r.stdout.strip()}"
            if check:
                raise NetnsError(f"command failed: {msg}")
            errors.append(msg)
    return errors


def parse_qdisc_stats(text: str) -> tuple[int, int]:
    """(packets sent, packets dropped) from ``tc -s qdisc show`` output."""
    sent = dropped = 0
    for m in re.finditer(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", text):
        sent += int(m.group(1))
        dropped += int(m.group(2))
    return sent, dropped


def list_namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30,
                       check=False)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(names: list[str], include_live: bool = False) -> list[str]:
    """Namespaces of ours (by prefix) whose creating process is gone (or all of them)."""
    out = []
    for n in names:
        m = re.match(rf"^{re.escape(PREFIX)}(\d+)-[0-9a-f]+-(sw|h\d+)$", n)
        if m and (include_live or not _pid_alive(int(m.group(1)))):
            out.append(n)
    return out


def namespace_pids(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30,
                       check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def cleanup(include_live: bool = False) -> list[str]:
    """Kill what runs in leftover namespaces of ours and delete them; return their names."""
    gone = leftovers(list_namespaces(), include_live)
    for ns in gone:
        for pid in namespace_pids(ns):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        run_cmds([["ip", "netns", "del", ns]], check=False)
    return gone


class Cluster:
    """Build a :class:`Plan` on entry, always tear it down on exit (also on errors)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.up = False

    def __enter__(self) -> Self:
        check_root()
        self.up = True          # set first: a half-built cluster is torn down too
        try:
            run_cmds(self.plan.setup_commands())
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, rate: str | None, latency_ms: float = 50.0, burst_ms: float = 10.0) -> None:
        run_cmds(self.plan.shape_commands(rate, latency_ms, burst_ms), check=rate is not None)

    def tcp_cc(self) -> str:
        """The TCP congestion control the emulated hosts use ('' if unreadable)."""
        r = subprocess.run(["ip", "netns", "exec", self.plan.hosts[0].ns, "cat",
                            "/proc/sys/net/ipv4/tcp_congestion_control"],
                           capture_output=True, text=True, timeout=30, check=False)
        return r.stdout.strip()

    def drops(self) -> dict:
        """Packets sent and dropped so far by the tbf qdiscs, summed over all links."""
        sent = dropped = 0
        for h in self.plan.hosts:
            for ns, dev in ((h.ns, h.dev), (self.plan.switch, h.port)):
                r = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev],
                                   capture_output=True, text=True, timeout=30,
                                   check=False)
                s, d = parse_qdisc_stats(r.stdout)
                sent, dropped = sent + s, dropped + d
        return {"packets": sent, "dropped": dropped}

    def close(self) -> list[str]:
        if not self.up:
            return []
        self.up = False
        names = [h.ns for h in self.plan.hosts] + [self.plan.switch]
        present = set(list_namespaces())
        for ns in names:
            if ns in present:
                for pid in namespace_pids(ns):
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
        return run_cmds([c for c in self.plan.teardown_commands() if c[-1] in present],
                        check=False)

    def __exit__(self, *exc) -> None:
        self.close()

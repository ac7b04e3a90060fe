"""A real OpenSSH server per network namespace for the ``bpslaunch -H`` tests.

Keys live in a temporary folder: one host key (every "host" presents it, so one
``known_hosts`` line ``* ssh-ed25519 ...`` covers them all) and one client key in
the server's ``authorized_keys``; ``ssh_config`` is what bpslaunch gets through
``--ssh-config``, so the user's own ``~/.ssh`` is neither read nor changed.

    keys = SshKeys(tmp_path)
    with podnet.PodNet(["login", "h1", "h2"]) as net:
        servers = [start_sshd(net, h, keys) for h in ("h1", "h2")]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def skip_reason() -> str | None:
    """Why a test cannot run sshd in network namespaces here, or None."""
    if os.geteuid() != 0:
        return "sshd in network namespaces needs root (CI runs the tests as root)"
    for prog, pkg in ((SSHD, "openssh-server"), ("ssh", "openssh-client"),
                      ("ssh-keygen", "openssh-client")):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (apt-get install {pkg}; .ci/run does)"
    import podnet
    return podnet.skip_reason()


class SshKeys:
    """Host key, client key, authorized_keys, known_hosts, sshd_config and ssh_config."""

    def __init__(self, folder: Path):
        self.dir = Path(folder) / "ssh"
        self.dir.mkdir(mode=0o700)
        for name in ("host_key", "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bps-test",
                            "-f", str(self.dir / name)], check=True, timeout=30)
        self.identity = self.dir / "id_ed25519"
        (self.dir / "authorized_keys").write_text((self.dir / "id_ed25519.pub").read_text())
        (self.dir / "known_hosts").write_text("* " + (self.dir / "host_key.pub").read_text())
        self.sshd_config = self.dir / "sshd_config"
        self.sshd_config.write_text("\n".join([
            "Port 22", "ListenAddress 0.0.0.0", f"HostKey {self.dir / 'host_key'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}", "StrictModes no",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "PidFile none",
            "LogLevel ERROR", "UseDNS no", ""]))
        self.ssh_config = self.dir / "ssh_config"
        self.ssh_config.write_text("\n".join([
            "Host *", "  User root", f"  UserKnownHostsFile {self.dir / 'known_hosts'}",
            "  StrictHostKeyChecking yes", "  GlobalKnownHostsFile /dev/null", ""]))


def start_sshd(net, host: str, keys: SshKeys, timeout: float = 20) -> subprocess.Popen:
    """sshd in the foreground in ``host``'s namespace, once it accepts connections."""
    os.makedirs("/run/sshd", exist_ok=True)             # Debian's privilege separation dir
    p = subprocess.Popen(["ip", "netns", "exec", net.ns[host], SSHD, "-D", "-e", "-f",
                          str(keys.sshd_config)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    probe = ("import socket,sys\ns=socket.socket()\ns.settimeout(0.5)\n"
             "sys.exit(s.connect_ex(('127.0.0.1',22)))")
    deadline = time.monotonic() + timeout
    while subprocess.run(["ip", "netns", "exec", net.ns[host], sys.executable, "-c", probe],
                         capture_output=True, timeout=30, check=False).returncode:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError(f"sshd in {host} did not start: {p.communicate()[0]}")
        time.sleep(0.1)
    return p

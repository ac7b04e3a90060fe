"""BYTEPS_TCP_CONGESTION: every connection between workers and servers uses the chosen TCP
congestion control (seen from outside, by iproute2's ``ss``); unset, cubic (reno without
the right to cubic) replaces a bbr default on short connections, and ``host`` keeps the
host's; a name the kernel has not, or does not allow, is a clear error at init."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import assert_ok, job_env, read_results, run_script

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "TCP_CONGESTION") or shutil.which("ss") is None,
    reason="needs Linux's TCP_CONGESTION and iproute2's ss")


def _host_default() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conns(tmp_path, **env) -> list:
    port = _free_port()
    res = run_script("tcp_congestion.py", tmp_path, port, workers=2, servers=1, timeout=120,
                     BYTEPS_ENABLE_IPC="0", BYTEPS_SERVER_PORT=port, **env)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    conns = {tuple(c) for r in out.values() for c in r["conns"]}
    # both ends of both workers' connections to the server: 4 sockets at least
    assert len(conns) >= 4, conns
    return sorted(conns)


def test_connections_use_the_chosen_congestion_control(tmp_path):
    # reno is built into every Linux kernel and always allowed
    want = "reno" if _host_default() != "reno" else "cubic"
    conns = _conns(tmp_path, BYTEPS_TCP_CONGESTION=want)
    assert {c[2] for c in conns} == {want}, conns


def _unset_gives() -> str:
    """What docs/configuration.md promises without the variable, from /proc alone."""
    host = _host_default()
    if host != "bbr":
        return host
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        allowed = f.read().split()
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        available = f.read().split()
    may = os.geteuid() == 0 or "cubic" in allowed       # root may take any available one
    return "cubic" if may and "cubic" in available else "reno"


def test_without_it_short_connections_leave_a_bbr_default(tmp_path):
    conns = _conns(tmp_path)
    assert {c[2] for c in conns} == {_unset_gives()}, conns


def test_host_keeps_the_hosts_default(tmp_path):
    conns = _conns(tmp_path, BYTEPS_TCP_CONGESTION="host")
    assert {c[2] for c in conns} == {_host_default()}, conns


def _pair():
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen()
    c = socket.create_connection(lis.getsockname())
    a, _ = lis.accept()
    lis.close()
    return c, a


def _cc(s) -> str:
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def test_the_unset_choice_leaves_long_round_trips_alone(monkeypatch):
    """A connection across regions (a round trip of SHORT_RTT_US or more) keeps the host's
    control; both ends of a loopback connection measured their handshake's round trip."""
    from byteps.transport import congestion
    want = "reno" if _host_default() != "reno" else "cubic"
    c, a = _pair()
    with c, a:
        for s in (c, a):
            rtt = congestion.min_rtt_us(s)
            assert rtt is not None and 0 < rtt < congestion.SHORT_RTT_US, rtt
        monkeypatch.setattr(congestion, "SHORT_RTT_US", 1)      # every path is "long"
        assert not congestion.apply(c.fileno(), want, short_only=True)
        assert _cc(c) == _host_default()
        monkeypatch.undo()
        assert congestion.apply(c.fileno(), want, short_only=True) and _cc(c) == want
        assert congestion.apply(a.fileno(), want) and _cc(a) == want


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="drops CAP_NET_ADMIN with util-linux's setpriv, as root")
def test_without_the_right_to_cubic_a_bbr_default_gives_way_to_reno():
    code = ("from byteps.transport import congestion as c\n"
            "print(c.choice(None), c.problem('cubic'), sep='|')")
    p = subprocess.run(["setpriv", "--bounding-set", "-net_admin", sys.executable, "-c", code],
                       env=job_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    choice, why = p.stdout.strip().split("|")
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        allowed = f.read().split()
    if _host_default() != "bbr":
        assert choice == "None", choice
    elif "cubic" in allowed:
        assert choice == "Choice(name='cubic', short_only=True)", choice
    else:
        assert choice == "Choice(name='reno', short_only=True)", choice
        assert "is not allowed for this user" in why, why


def test_a_name_the_kernel_has_not_is_a_clear_error():
    import subprocess
    env = job_env(BYTEPS_TCP_CONGESTION="no-such-cc", DMLC_ROLE="server",
                  DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1", DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT="1")
    p = subprocess.run([sys.executable, "-c", "from byteps.common.config import Config\n"
                        "Config.from_env()"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    assert "BYTEPS_TCP_CONGESTION='no-such-cc'" in p.stderr, p.stderr
    assert "tcp_available_congestion_control" in p.stderr, p.stderr


def test_sweep_sets_a_connection_that_was_up_before_its_watch():
    """What a replica's connection and a worker's connection up before its monitor get."""
    from byteps.transport import congestion
    want = "reno" if _host_default() != "reno" else "cubic"
    c, a = _pair()
    with c, a:
        peer = "tcp://%s:%d" % c.getpeername()
        assert _cc(c) == _host_default()
        assert congestion.sweep(peer, "host") == 0 and _cc(c) == _host_default()
        assert congestion.sweep(peer, want) == 1
        assert _cc(c) == want                   # the connection to that peer
        assert _cc(a) == _host_default()        # not the accepted end (another peer)

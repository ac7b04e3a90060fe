"""BYTEPS_TCP_CONGESTION: every connection between workers and servers uses the chosen TCP
congestion control (seen from outside, by iproute2's ``ss``), the host's default without
it, and a name the kernel has not, or does not allow, is a clear error at init."""
from __future__ import annotations

import shutil
import socket
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


def test_without_it_connections_keep_the_hosts_default(tmp_path):
    conns = _conns(tmp_path)
    assert {c[2] for c in conns} == {_host_default()}, conns


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
    with socket.socket() as lis:
        lis.bind(("127.0.0.1", 0))
        lis.listen()
        port = lis.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as c:
            a, _ = lis.accept()
            with a:
                def cc(s):
                    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                                        16).rstrip(b"\0").decode()
                assert cc(c) == _host_default()
                assert congestion.sweep(f"tcp://127.0.0.1:{port}", want) == 1
                assert cc(c) == want                   # the connection to that peer
                assert cc(a) == _host_default()        # not the accepted end (another peer)
                assert congestion.apply(a.fileno(), want) and cc(a) == want

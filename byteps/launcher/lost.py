"""Role mode: tell the scheduler that a worker this bpslaunch started died (``Op.LOST``).

On a cluster the scheduler cannot see a worker that dies before it registered: without
this, a fixed-size job waited BYTEPS_STARTUP_TIMEOUT and then named the registrations
missing, and an elastic one waited before forming without it.  The worker host's
bpslaunch sees the death at once (its child) and sends one authenticated LOST message
(``{"role", "host_id", "pid", "what", "how"}``) to ``DMLC_PS_ROOT_URI:PORT``; the
scheduler (byteps/scheduler/lost.py) ends a job that cannot form any more with that
cause, or forms an elastic one without the dead worker.  After formation it only logs
it (the connection and the heartbeats tell it already).  Sent from a thread: the
supervision loop never waits for the network.
"""
from __future__ import annotations

import os
import secrets
import threading

from byteps.common.errors import PEER_FAILED_EXIT
from byteps.launcher.supervise import describe_code

LINGER_MS = 2000        # how long the message may wait for the scheduler's connection


def how(code: int) -> str:
    """'was killed by SIGKILL' / 'exited with exit code 3'."""
    text = describe_code(code)
    return f"was killed by {text[len('signal '):]}" if code < 0 else f"exited with {text}"


def body(cfg, pid: int, what: str, code: int) -> dict:
    host = str(cfg.host_id or cfg.node_host or "?")
    return {"role": "worker", "host_id": host[:256], "pid": pid, "what": what[:300],
            "how": how(code)}


def send(cfg, msg: dict) -> None:
    """One LOST message to the scheduler; errors are ignored (the start-up timeout stays)."""
    import zmq

    from byteps import transport
    from byteps.transport.wire import Op, encode, new_seq
    ctx = zmq.Context()
    try:
        sock = transport.connect(ctx, f"tcp://{cfg.root_uri}:{cfg.root_port}",
                                 f"l/{os.getpid()}/{secrets.token_hex(8)}".encode())
        secret = cfg.job_secret.encode() if cfg.job_secret else None
        sock.send_multipart(encode(cfg.job_id, -1, Op.LOST, 0, new_seq(), msg, secret))
        sock.close(LINGER_MS)
    except zmq.ZMQError:
        pass
    finally:
        ctx.term()


def reporter(cfg, workers: list):
    """``Job.on_exit`` for a role-mode worker host: report the workers that died for their
    own reason (not exit 0, not PEER_FAILED_EXIT: they learned of another failure)."""
    def on_exit(p) -> None:
        code = p.p.returncode
        if p not in workers or code in (0, PEER_FAILED_EXIT, None):
            return
        threading.Thread(target=send, args=(cfg, body(cfg, p.p.pid, p.what, code)),
                         name="bpslaunch-lost").start()
    return on_exit

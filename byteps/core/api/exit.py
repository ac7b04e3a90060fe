"""The worker's process exit (split from :mod:`byteps.core.api`): an uncaught exception is
remembered, and at exit the scheduler is told that this worker ends, ok or with its error
(so the job names the real cause), after the engine and local reduction are closed."""
from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import time
import types

import zmq

from byteps.common.errors import BytePSError
from byteps.common.node import leave_reason
from byteps.core import api
from byteps.core import state as _st
from byteps.transport.wire import Op, encode, new_seq

log = logging.getLogger("byteps.worker")
_HOOKED = False
#: this worker failed because another local rank did: it leaves a moment later, so the
#: scheduler and bpslaunch hear of the rank with the cause first
_SECONDARY: list = []
_SECONDARY_DELAY_S = 1.0


def install_exit_hooks() -> None:
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    prev = sys.excepthook

    def hook(tp, val, tb):
        api._FAILED.append(f"{tp.__name__}: {val}")
        if getattr(val, "secondary", False):
            _SECONDARY.append(True)
        tb = _short(val, tb)
        if isinstance(val, BaseException):
            val.with_traceback(tb)      # (Python prints the exception's own traceback)
        prev(tp, val, tb)
    sys.excepthook = hook
    atexit.register(at_exit)


_PKG = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _short(val, tb):
    """One block per cause: a BytePSError's traceback ends at the user's own frame (the
    byteps frames below it say nothing the message does not); a job-wide data error
    (every rank got the server's refusal) is printed with its traceback by the rank it
    names only, as one line by the others."""
    if not isinstance(val, BytePSError) or tb is None:
        return tb
    if getattr(val, "brief", False):
        return None
    st = _st.current()
    errors = getattr(getattr(st, "engine", None), "key_errors", None) or {}
    named = re.search(r"\brank (\d+) \(host", str(val))
    if str(val) in errors.values() and named and st.rank is not None and \
            int(named.group(1)) != st.rank:
        return None
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    first = next((i for i, f in enumerate(frames)
                  if f.tb_frame.f_code.co_filename.startswith(_PKG + os.sep)), 0)
    if first == 0:
        return frames[0]
    out = None
    for f in reversed(frames[:first]):
        out = types.TracebackType(out, f.tb_frame, f.tb_lasti, f.tb_lineno)
    return out


def at_exit() -> None:
    """Tell the scheduler this worker process ends (ok, or with its error)."""
    st = _st.current()
    body = {"ok": not api._FAILED, "reason": api._FAILED[0] if api._FAILED else ""}
    if _SECONDARY:
        time.sleep(_SECONDARY_DELAY_S)
    if api._FAILED and not api._FAILED[0].startswith("KeyboardInterrupt"):
        leave_reason(api._FAILED[0])      # bpslaunch's last line names it
    try:
        if st is not None and st.engine is not None:
            api._finish(st)
        if st is not None and st.local is not None:
            st.local.close(remove=bool(api._FAILED))
        if st is not None and st.engine is not None:
            from byteps.core.elastic import allow_stop
            allow_stop(st.engine)      # elastic: an interrupted epoch still exits cleanly
        if st is not None and st.engine is not None and st.engine.fatal is None:
            st.engine.stop(leave=False)
            st.link.send(Op.EXIT, body)
            st.link.close(linger_ms=1000)
            # end ZeroMQ's I/O threads before the interpreter frees the buffers of
            # messages they might still hold
            st.ctx.destroy(linger=0)
            return
        if st is None and api._LAST_LINK is not None:
            cfg = api._LAST_LINK["cfg"]
            ctx = zmq.Context()      # own context: term() below waits until EXIT is out
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 2000)
            s.setsockopt(zmq.IDENTITY, api._LAST_LINK["identity"])
            s.connect(f"tcp://{cfg.root_uri}:{cfg.root_port}")
            s.send_multipart(encode(cfg.job_id, api._LAST_LINK["node_id"], Op.EXIT,
                                    api._LAST_LINK["epoch"], new_seq(), body,
                                    cfg.job_secret.encode() if cfg.job_secret else None))
            s.close()
            ctx.term()
    except Exception as exc:  # exiting anyway; never mask the real error
        log.debug("exit notification failed: %s", exc)

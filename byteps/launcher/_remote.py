"""The remote end of ``bpslaunch -H``: ``python -m byteps.launcher._remote``, one per ssh session.

bpslaunch runs ``ssh HOST 'cd DIR && exec PYTHON -m byteps.launcher._remote'``: the
command line that ``ps`` shows on either machine holds no secret.  The first line
bpslaunch writes to the session's standard input is a JSON object::

    {"what": "worker 3", "argv": [...], "env": {...}, "announce": false, "interface": null}

with the job's variables (``BYTEPS_JOB_SECRET`` among them).  This bootstrap then
starts ``argv`` in a process group of its own with the login environment plus
``env``, prints ``STARTED PID`` (the scheduler, with ``announce``: ``ADDRESS
ADDR PORT PID``, the address and a free port it listens on, which bpslaunch hands
to everyone else) before the process can write anything, and stays its parent:

* later lines ``signal N`` send signal N to the process group (Ctrl-C reaches the
  workers as SIGINT, so as KeyboardInterrupt);
* end of input (bpslaunch ended, was killed, or the ssh connection broke) ends the
  group: SIGTERM, SIGKILL ``KILL_AFTER_S`` later.  Nothing outlives its ssh session;
* when the process ends, the bootstrap exits with its exit code (128 + N for a
  signal N; one not sent by bpslaunch is also reported in one line) and kills what
  is left of the group.

``--check`` only says ``ok`` (bpslaunch's reachability check of every host);
``--check --rendezvous [IF]`` says ``ok ADDR PORT``, this host's address and a free port
(torch's ``MASTER_ADDR``/``MASTER_PORT`` when this is the first worker host).  With
``"address"`` in the header the scheduler listens there (a job of one machine: loopback);
with ``"summary"`` the worker's end-of-job summary (byteps.common.summary) comes back as
one ``SUMMARY {json}`` line on standard output after it ended.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading

from byteps.launcher.supervise import _pdeathsig

MARK = "bpslaunch-remote:"
KILL_AFTER_S = 2.0


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` on this machine (raises OSError)."""
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def own_address(interface: str | None) -> str:
    """The address others reach this machine at: the interface's, else the address this
    ssh session came in on (``SSH_CONNECTION``), else the host name's."""
    if interface:
        return interface_address(interface)
    conn = os.environ.get("SSH_CONNECTION", "").split()
    if len(conn) == 4:
        addr = conn[2]
        addr = addr.removeprefix("::ffff:")
        if addr == "::1":
            return "127.0.0.1"
        if ":" not in addr:
            return addr
    return socket.gethostbyname(socket.gethostname())


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _say(text: str) -> None:
    print(f"{MARK} {text}", file=sys.stderr, flush=True)


def _kill(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Child:
    """``argv`` forked in a session of its own, held before exec until ``go()`` (so that
    its pid is known, and said, before it can write anything)."""

    def __init__(self, argv: list[str], env: dict, what: str):
        gate_r, gate_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                                   # the child
            code = 127
            try:
                os.close(gate_w)
                os.setsid()
                _pdeathsig()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                if not os.read(gate_r, 1):                  # the bootstrap died first
                    os._exit(1)
                os.close(gate_r)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):    # as Popen's restore_signals
                    signal.signal(sig, signal.SIG_DFL)
                try:
                    os.execvpe(argv[0], argv, env)
                except OSError as exc:
                    code = 127 if isinstance(exc, FileNotFoundError) else 126
                    _say(f"{what} on {socket.gethostname()}: cannot start {argv[0]}: "
                         f"{exc.strerror or exc}")
            finally:
                os._exit(code)
        os.close(gate_r)
        self._gate = gate_w
        self.returncode: int | None = None

    def go(self) -> None:
        os.write(self._gate, b"x")
        os.close(self._gate)

    def wait(self) -> int:
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except InterruptedError:
                pass
        return self.returncode


def _watch_input(child: _Child, done: threading.Event, asked: set) -> None:
    """Forward ``signal N`` lines; end the group when the input ends."""
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "signal" and parts[1].isdigit():
            asked.add(int(parts[1]))
            _kill(child.pid, int(parts[1]))
    if done.is_set():
        return
    # bpslaunch or the connection is gone: nothing of this session may stay
    asked.update((signal.SIGTERM, signal.SIGKILL))
    _kill(child.pid, signal.SIGTERM)
    if not done.wait(KILL_AFTER_S):
        _kill(child.pid, signal.SIGKILL)


def _send_summaries(folder: str) -> None:
    """Each summary the worker left, as one ``SUMMARY {json}`` line for bpslaunch."""
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as f:
                    doc = json.load(f)
                print(f"{MARK} SUMMARY {json.dumps(doc)}", flush=True)
            except (OSError, ValueError):
                pass
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        print("ok", flush=True)
        return 0
    if argv[:2] == ["--check", "--rendezvous"]:
        addr = own_address(argv[2] if len(argv) > 2 else None)
        print(f"ok {addr} {free_port(addr)}", flush=True)
        return 0
    header = sys.stdin.readline()
    if not header:
        return 1                                # bpslaunch went away before it said anything
    spec = json.loads(header)
    env = dict(os.environ, **spec["env"])
    env.setdefault("PYTHONUNBUFFERED", "1")     # output goes through ssh: lines, not blocks
    for k in ("SSH_CONNECTION", "SSH_CLIENT"):
        env.pop(k, None)
    what = spec.get("what", "process")
    if spec.get("announce"):
        try:
            addr = spec.get("address") or own_address(spec.get("interface"))
            port = int(env.get("DMLC_PS_ROOT_PORT") or free_port(addr))
        except OSError as exc:
            _say(f"{what} on {socket.gethostname()}: no address to listen on "
                 f"(--network-interface {spec.get('interface')}?): {exc}")
            return 2
        env.update(DMLC_PS_ROOT_URI=addr, DMLC_PS_ROOT_PORT=str(port))
    summaries = tempfile.mkdtemp(prefix="bpslaunch-summary-") if spec.get("summary") else None
    if summaries:
        env["BPSLAUNCH_SUMMARY_DIR"] = summaries
    child = _Child(spec["argv"], env, what)
    if spec.get("announce"):
        print(f"{MARK} ADDRESS {env['DMLC_PS_ROOT_URI']} {env['DMLC_PS_ROOT_PORT']} "
              f"{child.pid}", flush=True)
    else:
        print(f"{MARK} STARTED {child.pid}", flush=True)
    child.go()                  # only now: bpslaunch reads the line above first
    done, asked = threading.Event(), set()
    threading.Thread(target=_watch_input, args=(child, done, asked), daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda s, _f: (asked.add(s), _kill(child.pid, s)))
    code = child.wait()
    done.set()
    _kill(child.pid, signal.SIGKILL)            # whatever it left behind in its group
    if summaries:
        _send_summaries(summaries)
    if code < 0:
        if -code not in asked:                  # not one bpslaunch sent: say who did
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            _say(f"{what} (pid {child.pid}) on {socket.gethostname()} was killed by {name}")
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

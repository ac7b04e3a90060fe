"""Files the elastic test scripts use to act once and to drive host discovery (OUT dir),
and the server they kill."""
import os
import signal


def mark(out: str, name: str) -> bool:
    """Create OUT/name once; True the first time (a restored step does not repeat it)."""
    try:
        os.close(os.open(os.path.join(out, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def hosts(out: str, n: int) -> None:
    """Write OUT/hosts (read by the discovery script) atomically: ``localhost:n``."""
    with open(os.path.join(out, "hosts.tmp"), "w") as f:
        f.write(f"localhost:{n}\n")
    os.replace(os.path.join(out, "hosts.tmp"), os.path.join(out, "hosts"))


def kill_a_server() -> int:
    """SIGKILL the server process bpslaunch (our parent) started last; its pid."""
    parent, found = os.getppid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"byteps.server" in argv:
            found.append(int(pid))
    if not found:
        raise SystemExit("no server process found among bpslaunch's children")
    os.kill(max(found), signal.SIGKILL)
    return max(found)

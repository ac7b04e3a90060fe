"""Files the elastic test scripts use to act once and to drive host discovery (OUT dir)."""
import os


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

"""Small pieces of the local reduction: an operation's state, the slice tensors the
Engine pushes, the Engine completion hook and peer liveness (no threads, no sockets)."""
from __future__ import annotations

import os


class SliceTensor:
    """What the Engine needs of a tensor: the slice ``<name>.slice<k>``."""
    __slots__ = ("busy", "dtype_code", "key", "name", "shape", "spec", "pipes", "comp_wire",
                 "wire_flags", "outer", "op")

    def __init__(self, name: str, key: int, length: int, dtype_code: int, spec=None,
                 wire_flags: int = 0, outer=None, op: int = 0):
        self.name, self.key, self.shape, self.dtype_code = name, key, (length,), dtype_code
        self.op = op                     # the servers' reduction across hosts (wire.REDUCE_OPS)
        self.wire_flags = wire_flags     # wire.ASYNC: the host's sum of deltas, asynchronous
        self.outer = outer               # DiLoCo's outer optimizer (wire.outer_field)
        self.busy = None
        # compression of what leaves the host (the whole tensor's settings, per slice)
        self.spec, self.pipes = spec, {}
        self.comp_wire = spec.to_wire() if spec is not None else []


class NetDone:
    """A slice chunk the engine finished (or failed, ``h.error``), queued for the reducer's
    thread by the slice handle's completion callback."""
    __slots__ = ("h", "j", "k", "op")

    def __init__(self, op, k: int, j: int, h):
        self.op, self.k, self.j, self.h = op, k, j, h


class Op:
    """One push_pull in the local reduction: its segment, round and per-stage progress."""
    __slots__ = (
        "average",
        "copy",
        "gather",
        "handle",
        "l1",
        "net",
        "net_round",
        "out",
        "pre",
        "prio",
        "raw",
        "red",
        "round",
        "seg",
        "seq",
        "slices",
        "src",
        "started",
        "t",
        "t_red",
        "tensor",
        "value",
        "warned",
    )

    def __lt__(self, other: Op) -> bool:
        return (self.prio, self.seq) < (other.prio, other.seq)


class EngineSpeed:
    """Stands in for the Engine's speed meter: with local reduction the Engine only moves
    slices, so push_pull telemetry is counted per whole tensor by the reducer instead."""

    def __init__(self, real):
        self.real = real

    def add(self, nbytes, now=None) -> None:
        pass

    def op_done(self, seconds) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self.real, name)


def alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

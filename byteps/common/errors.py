"""The errors every role raises; no dependencies, so any module can import them."""
from __future__ import annotations


# Exit code of a process that ended because another process of the job failed
# (the scheduler's TERMINATE or NODE_DEAD, a dead scheduler).  bpslaunch reports
# the process that failed for its own reason instead of these.
PEER_FAILED_EXIT = 86


class BytePSError(RuntimeError):
    """A BytePS operation failed; the message names the tensor, ranks and the fix.

    Its :data:`FLAGS` say how the process exit reports it (byteps/core/api/exit.py: one
    block per cause): ``brief``, printed as one line without traceback (another rank
    prints the cause's block); ``secondary``, this rank failed because another local rank
    did, so it leaves a moment after that one."""

    brief = False
    secondary = False


class ConfigError(ValueError):
    """A BytePS environment variable is missing or malformed."""


#: the attributes of an error that travel with it from a background thread to the user's
FLAGS = ("brief", "secondary")


def again(err: BaseException) -> BytePSError:
    """The error to raise in the user's thread for ``err``, which a background thread
    recorded (on a handle): a fresh BytePSError with its message and :data:`FLAGS`."""
    out = BytePSError(str(err))
    for flag in FLAGS:
        setattr(out, flag, getattr(err, flag, False))
    return out

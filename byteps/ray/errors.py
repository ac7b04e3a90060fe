"""The errors of byteps.ray (no dependency on Ray, so that they unpickle anywhere)."""
from __future__ import annotations


class RayExecutorError(RuntimeError):
    """The BytePS job on Ray could not start or failed outside ``train_fn`` (a scheduler
    or server process ended, an actor could not be placed)."""


class WorkerFailedError(RayExecutorError):
    """``train_fn`` raised (or its actor died) on one rank.

    ``rank``, ``host`` (the node's address and name), ``cause`` (``"ValueError: ..."``)
    and ``remote_traceback`` (the worker's traceback as text) say where and why.
    """

    def __init__(self, rank: int, host: str, cause: str, remote_traceback: str = ""):
        self.rank, self.host, self.cause = rank, host, cause
        self.remote_traceback = remote_traceback
        text = f"train_fn failed on rank {rank} (host {host}): {cause}"
        if remote_traceback:
            text += f"\n--- traceback of rank {rank} on {host} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.rank, self.host, self.cause, self.remote_traceback))

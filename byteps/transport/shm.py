"""Shared-memory payloads between a worker and a server on the same machine.

Like the original's ``BYTEPS_ENABLE_IPC``: when a worker and a server share
a machine (same host name, boot and network namespace), the worker copies a
partition into its own segment and sends only the header; the server sums
straight out of the worker segments into one of two result segments (double
buffered by round parity) and answers with a header; the worker copies the
result out.  Payload bytes never cross a socket.

Segment paths are built by each side from validated integers (job id, node
ids, key, part) — never from strings received over the network.
"""
from __future__ import annotations

import mmap
import os
import socket

import numpy as np

_MACHINE = None


def machine_id() -> str:
    """Identity of this machine *and* network namespace (emulated hosts differ)."""
    global _MACHINE
    if _MACHINE is None:
        try:
            boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        except OSError:
            boot = "?"
        try:
            netns = os.stat("/proc/self/ns/net").st_ino
        except OSError:
            netns = 0
        _MACHINE = f"{socket.gethostname()}/{boot}/{netns}"
    return _MACHINE


def shm_dir() -> str:
    from byteps.core.local import shm as local_shm
    return local_shm.shm_dir(os.environ.get("BYTEPS_SHM_DIR"))


def job_prefix(job_id: str) -> str:
    """The same prefix the launcher removes after the job (byteps.core.local.shm)."""
    from byteps.core.local import shm as local_shm
    return local_shm.job_prefix(job_id)


def push_path(job_id: str, worker_node: int, key: int, part: int) -> str:
    return os.path.join(shm_dir(), f"{job_prefix(job_id)}w{worker_node}-{key:x}-{part}")


def result_path(job_id: str, server_node: int, key: int, part: int, parity: int) -> str:
    return os.path.join(shm_dir(), f"{job_prefix(job_id)}s{server_node}-{key:x}-{part}-{parity}")


class Segment:
    """A file in /dev/shm mapped into memory, viewed as a numpy array."""

    def __init__(self, path: str, nbytes: int, create: bool):
        self.path, self.nbytes = path, nbytes
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, max(nbytes, 1))
                try:   # reserve now: a full tmpfs must fail here, not SIGBUS on first write
                    os.posix_fallocate(fd, 0, max(nbytes, 1))
                except OSError as exc:
                    os.unlink(path)
                    raise OSError(exc.errno, f"cannot reserve {nbytes} bytes in {path} "
                                  f"({exc.strerror}); enlarge /dev/shm, point BYTEPS_SHM_DIR "
                                  f"elsewhere or set BYTEPS_ENABLE_IPC=0") from None
            elif os.fstat(fd).st_size != max(nbytes, 1):
                raise ValueError(f"shared-memory segment {path} has {os.fstat(fd).st_size} "
                                 f"bytes, expected {nbytes}")
            self.map = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.owner = create

    def array(self, dtype, length: int) -> np.ndarray:
        return np.frombuffer(self.map, dtype=dtype, count=length)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass          # a view is still alive; the mapping goes with the process
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def remove_job_segments(job_id: str) -> int:
    """Remove every segment of a job (launcher clean-up); returns how many."""
    pre, n = job_prefix(job_id), 0
    try:
        names = os.listdir(shm_dir())
    except OSError:
        return 0
    for name in names:
        if name.startswith(pre):
            try:
                os.unlink(os.path.join(shm_dir(), name))
                n += 1
            except OSError:
                pass
    return n

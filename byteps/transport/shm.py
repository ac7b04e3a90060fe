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

import ctypes
import hashlib
import mmap
import os
import re
import socket
import sys
import tempfile

import numpy as np

_MACHINE = None
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)      # Linux
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


class SharedMap:
    """A file mapped MAP_SHARED, read-write, that keeps **no file descriptor** open.

    Python's ``mmap.mmap`` keeps a duplicate of the file's descriptor for as long as the
    map lives: one descriptor per segment, so a job whose names keep growing (unnamed
    eager collectives, a long test suite) ran a server out of descriptors (EMFILE) after
    a few thousand names.  ``buf`` is a ctypes array over the mapping: numpy views are
    made with ``np.frombuffer(m.buf, ...)`` and each keeps ``buf`` alive.
    """

    def __init__(self, fd: int, nbytes: int, populate: bool = False):
        addr = _LIBC.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_SHARED | (_POPULATE if populate else 0), fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {nbytes} bytes: {os.strerror(err)}")
        self.addr, self.nbytes = addr, nbytes
        self.buf = (ctypes.c_char * nbytes).from_address(addr)

    def __len__(self) -> int:
        return self.nbytes

    def close(self) -> None:
        """Unmap, unless a numpy view of it is still alive (BufferError, as mmap's close):
        the mapping then stays until the process ends, and no view ever points at
        unmapped memory."""
        if self.buf is None:
            return
        if sys.getrefcount(self.buf) > 2:       # this attribute, getrefcount's argument
            raise BufferError("cannot close: views of the mapping are alive")
        self.buf = None
        _LIBC.munmap(self.addr, self.nbytes)


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


def _tag(s: str, keep: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", s)
    if len(safe) <= keep and safe == s:
        return safe
    return safe[:keep - 9] + "_" + hashlib.blake2b(s.encode(), digest_size=4).hexdigest()


def shm_dir(configured: str | None = None) -> str:
    """The directory for segments: ``configured`` (BYTEPS_SHM_DIR), /dev/shm, or the temp dir."""
    d = configured or "/dev/shm"
    return d if os.path.isdir(d) else tempfile.gettempdir()


def job_prefix(job_id: str) -> str:
    """File-name prefix of everything a job puts into the shm directory (the launcher
    removes it after the job)."""
    return f"bps-{_tag(job_id, 32)}-"


def host_prefix(job_id: str, host_id: str) -> str:
    """Prefix of one (possibly emulated) host's files of a job."""
    return f"{job_prefix(job_id)}{_tag(host_id, 24)}-"


def _env_dir() -> str:
    return shm_dir(os.environ.get("BYTEPS_SHM_DIR"))


def push_path(job_id: str, worker_node: int, key: int, part: int) -> str:
    return os.path.join(_env_dir(), f"{job_prefix(job_id)}w{worker_node}-{key:x}-{part}")


def result_path(job_id: str, server_node: int, key: int, part: int, parity: int) -> str:
    return os.path.join(_env_dir(), f"{job_prefix(job_id)}s{server_node}-{key:x}-{part}-{parity}")


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
            # page tables filled now, not by one fault per 4 KB page on the first round
            self.map = SharedMap(fd, max(nbytes, 1), populate=True)
        finally:
            os.close(fd)
        self.owner = create

    def array(self, dtype, length: int) -> np.ndarray:
        return np.frombuffer(self.map.buf, dtype=dtype, count=length)

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
        names = os.listdir(_env_dir())
    except OSError:
        return 0
    for name in names:
        if name.startswith(pre):
            try:
                os.unlink(os.path.join(_env_dir(), name))
                n += 1
            except OSError:
                pass
    return n

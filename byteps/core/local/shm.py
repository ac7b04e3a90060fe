"""Shared-memory segments of one host's local reduction.

Every file of a job lives in ``BYTEPS_SHM_DIR`` (default ``/dev/shm``) under
the prefix ``bps-<job>-<host>-e<epoch>-``, so that one ``unlink`` by prefix
(:func:`remove_prefix`, used by ``bpslaunch`` after any exit) leaves nothing
behind.  One segment per tensor name holds a header, small per-chunk
counters and the data buffers::

    header   8 x int64: magic, version, dtype code, n, local size, chunks,
             groups, chunk elements
    counters 4 x [local size][chunks] int64: copied, gdone, reduced, done
             (each holds round+1 once that stage of that round is complete)
    inputs   [local size][n]   each local rank's copy of its tensor
    groups   [groups][n]       partial sums of each group (two-level only)
    out      [n]               the reduced (then pulled) result

A segment is published atomically: it is written under a temporary name and
hard-linked to its final name, so a local rank that opens it never sees a
half-written header.  Data is never pickled; only raw numbers are shared.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import re
import tempfile

import numpy as np

MAGIC = 0x4C41434F4C535042  # "BPSLOCAL"
VERSION = 1
HEADER = 8
ALIGN = 64
COUNTERS = ("copied", "gdone", "reduced", "done")


def _tag(s: str, keep: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", s)
    if len(safe) <= keep and safe == s:
        return safe
    return safe[:keep - 9] + "_" + hashlib.blake2b(s.encode(), digest_size=4).hexdigest()


def shm_dir(configured: str | None = None) -> str:
    """The directory for segments: BYTEPS_SHM_DIR, /dev/shm, or the temp dir."""
    d = configured or "/dev/shm"
    return d if os.path.isdir(d) else tempfile.gettempdir()


def job_prefix(job_id: str) -> str:
    """File-name prefix of everything a job puts into the shm directory."""
    return f"bps-{_tag(job_id, 32)}-"


def host_prefix(job_id: str, host_id: str) -> str:
    """Prefix of one (possibly emulated) host's files of a job."""
    return f"{job_prefix(job_id)}{_tag(host_id, 24)}-"


def remove_prefix(directory: str, prefix: str) -> list[str]:
    """Unlink every file in ``directory`` whose name starts with ``prefix``; return them."""
    if not prefix.startswith("bps-"):
        raise ValueError(f"refusing to remove files with prefix {prefix!r} (not a BytePS prefix)")
    gone = []
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
                gone.append(name)
            except FileNotFoundError:
                pass
            except OSError:
                pass
    return gone


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


class Segment:
    """The shared buffers of one tensor on one host (numpy views over an mmap)."""

    def __init__(self, path: str, name: str, dtype: np.dtype, dtype_code: int, n: int,
                 local_size: int, chunk: int, groups: int, local_rank: int):
        self.path, self.name = path, name
        self.dtype = np.dtype(dtype)
        self.n, self.L, self.chunk, self.G = n, local_size, chunk, groups
        self.C = -(-n // chunk) if n else 0
        cnt = max(1, self.C)
        self.off_counters = _align(HEADER * 8)
        self.off_in = _align(self.off_counters + 4 * local_size * cnt * 8)
        item = self.dtype.itemsize
        self.off_g = _align(self.off_in + local_size * n * item)
        gbytes = groups * n * item if groups > 1 else 0
        self.off_out = _align(self.off_g + gbytes)
        self.size = _align(self.off_out + n * item)
        want = [MAGIC, VERSION, dtype_code, n, local_size, self.C, groups, chunk]
        self.created = False
        self.owner: int | None = None   # small tensor: the one local rank that reduces it
        self.mm = self._create_or_open(want, local_rank)
        buf = self.mm
        hdr = np.frombuffer(buf, np.int64, HEADER, 0)
        if list(hdr) != want:
            got = list(map(int, hdr))
            self.close()
            raise ValueError(
                f"tensor {name!r}: local rank {local_rank} uses {n} x {self.dtype.name} "
                f"(local size {local_size}, chunk {chunk}, groups {groups}) but another local "
                f"rank of this host created its shared buffer with {got[3]} elements of dtype "
                f"code {got[2]} (local size {got[4]}, chunk {got[7]}, groups {got[6]}); every "
                f"local rank must push the same shape and dtype under one name and use the same "
                f"BYTEPS_PARTITION_BYTES / BYTEPS_PCIE_SWITCH_SIZE")
        c = np.frombuffer(buf, np.int64, 4 * local_size * cnt, self.off_counters)
        c = c.reshape(4, local_size, cnt)
        self.copied, self.gdone, self.reduced, self.done = c[0], c[1], c[2], c[3]
        self.inputs = np.frombuffer(buf, self.dtype, local_size * n, self.off_in).reshape(
            local_size, n)
        self.gsum = (np.frombuffer(buf, self.dtype, groups * n, self.off_g).reshape(groups, n)
                     if groups > 1 else None)
        self.out = np.frombuffer(buf, self.dtype, n, self.off_out)

    def _create_or_open(self, header: list[int], local_rank: int) -> mmap.mmap:
        tmp = f"{self.path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.size)
            mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        np.frombuffer(mm, np.int64, HEADER, 0)[:] = header
        try:
            os.link(tmp, self.path)
            self.created = True
            return mm
        except FileExistsError:
            mm.close()
        finally:
            os.unlink(tmp)
        fd = os.open(self.path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER * 8:
                raise ValueError(f"tensor {self.name!r}: shared buffer {self.path} is truncated "
                                 f"({size} bytes); remove stale files with this prefix")
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def chunk_range(self, j: int) -> tuple[int, int]:
        s = j * self.chunk
        return s, min(self.n, s + self.chunk)

    def split(self, j: int, parts: int, i: int) -> tuple[int, int]:
        """Elements [a, b) of part ``i`` of ``parts`` equal parts of chunk ``j``."""
        s, e = self.chunk_range(j)
        ln = e - s
        return s + ln * i // parts, s + ln * (i + 1) // parts

    def slice(self, j: int, k: int) -> tuple[int, int]:
        """Elements [a, b) of chunk ``j`` that local rank ``k`` reduces (and whose slice
        ``<name>.slice<k>`` goes to the servers): equal parts, or the whole chunk for the
        owner of a small tensor."""
        if self.owner is None:
            return self.split(j, self.L, k)
        s, e = self.chunk_range(j)
        return (s, e) if k == self.owner else (s, s)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.copied = self.gdone = self.reduced = self.done = None
        self.inputs = self.gsum = self.out = None
        try:
            self.mm.close()
        except (BufferError, AttributeError):
            pass   # a view is still alive somewhere; the mapping goes with the process

"""Shared-memory segments of one host's local reduction.

Every file of a job lives in ``BYTEPS_SHM_DIR`` (default ``/dev/shm``) under
the prefix ``bps-<job>-<host>-e<epoch>-``, so that one ``unlink`` by prefix
(:func:`byteps.common.shm_cleanup.remove_prefix`, also used by ``bpslaunch`` after
any exit) leaves nothing behind.  One segment per tensor name holds a header, small per-chunk
counters and the data buffers::

    header   10 x int64: magic, version, dtype code, n, local size, chunks,
             groups, chunk elements, window (chunks), reserved
    counters 5 x [local size][chunks] int64: copied, gdone, reduced, done, gathered
             (each holds round+1 once that stage of that round is complete)
    inputs   [local size][span]   each local rank's copy of its tensor
    groups   [groups][span]       partial sums of each group (two-level only)
    out      [span]               the reduced (then pulled) result

Normally ``span`` is the whole tensor (``window`` = chunks).  Every byte is
reserved with ``posix_fallocate`` before use, so a full tmpfs (Docker's 64 MB
``/dev/shm``) is an error at creation instead of a ``SIGBUS`` on first write.
When the whole tensor does not fit, the creator falls back to a *window*: the
buffers hold only ``window`` chunks and chunk ``j`` lives in slot
``j % window`` (:meth:`Segment.off`), reused once every local rank has
gathered chunk ``j - window``; without a network stage the chunks may also be
smaller than ``BYTEPS_PARTITION_BYTES``.  The header carries the layout the
creator chose, and the other local ranks adopt it.

A segment is published atomically: it is written under a temporary name and
hard-linked to its final name, so a local rank that opens it never sees a
half-written header.  Data is never pickled; only raw numbers are shared.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from byteps.transport.shm import SharedMap, host_prefix, job_prefix, shm_dir  # noqa: F401 (names live in transport)

log = logging.getLogger("byteps.local")
MAGIC = 0x4C41434F4C535042  # "BPSLOCAL"
VERSION = 2
HEADER = 10
ALIGN = 64
COUNTERS = ("copied", "gdone", "reduced", "done", "gathered")
MIN_CHUNK_BYTES = 65536     # smallest chunk of a window that shrinks its chunks
FIX = ("give the host more shared memory (Docker: `docker run --shm-size=1g ...`, whose "
       "default /dev/shm is 64 MB; Kubernetes: an emptyDir volume with medium: Memory at "
       "/dev/shm) or point BYTEPS_SHM_DIR at a larger tmpfs")


class ShmSpaceError(ValueError):
    """The shared-memory directory cannot hold even the smallest buffer of a tensor."""


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged process may still allocate in ``directory`` (None: unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def warn_once(directory: str, prefix: str, message: str, *args) -> str | None:
    """Log ``message`` as a warning once per host (marker file ``<prefix>warned``; the
    local ranks of a host share the directory), at INFO otherwise.  Returns the marker's
    path when this process created it (its owner removes it at shutdown)."""
    path = os.path.join(directory, f"{prefix}warned")
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        log.info(message, *args)
        return None
    except OSError:
        path = None
    log.warning(message, *args)
    return path


class _Layout:
    """Byte offsets of one segment layout (see the module docstring)."""

    def __init__(self, n: int, L: int, chunk: int, groups: int, window: int, item: int):
        self.C = -(-n // chunk) if n else 0
        self.W = max(1, min(window, self.C))
        self.span = min(n, self.W * chunk)
        cnt = max(1, self.C)
        self.off_counters = _align(HEADER * 8)
        self.off_in = _align(self.off_counters + len(COUNTERS) * L * cnt * 8)
        self.off_g = _align(self.off_in + L * self.span * item)
        self.off_out = _align(self.off_g + (groups * self.span * item if groups > 1 else 0))
        self.size = _align(self.off_out + self.span * item)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _dtype_name(code: int) -> str:
    from byteps.transport.wire import DTYPES
    try:
        return np.dtype(DTYPES[code]).name
    except (IndexError, KeyError, TypeError):
        return f"dtype code {code}"


class SegmentMismatch(ValueError):
    """A local rank opens a segment another local rank created for another shape/dtype."""


class Segment:
    """The shared buffers of one tensor on one host (numpy views over an mmap).

    ``fixed_chunk`` (the default) keeps ``chunk``: with a network stage the chunks are
    the partitions of the slices on the servers, identical on every host.  Without one
    (a single host) a segment that does not fit may use smaller chunks.
    """

    def __init__(self, path: str, name: str, dtype: np.dtype, dtype_code: int, n: int,
                 local_size: int, chunk: int, groups: int, local_rank: int,
                 fixed_chunk: bool = True, shape_tag: int = 0):
        self.path, self.name = path, name
        self.dtype = np.dtype(dtype)
        self.n, self.L, self.G = n, local_size, groups
        self.fixed_chunk = fixed_chunk
        self.fallback: str | None = None   # why the creator chose a window (for a warning)
        want = [MAGIC, VERSION, dtype_code, n, local_size, -(-n // chunk) if n else 0, groups,
                chunk]
        self.created = False
        self.shape_tag = shape_tag
        self.owner: int | None = None   # small tensor: the one local rank that reduces it
        self.mm = self._create_or_open(want, chunk)
        buf = self.mm.buf
        hdr = [int(x) for x in np.frombuffer(buf, np.int64, HEADER, 0)]
        # header slot 9: a fingerprint of the shape (same element count, other shape)
        same = hdr[:5] == want[:5] and hdr[6] == groups and hdr[9] == shape_tag
        if same and not fixed_chunk and hdr[7] > 0:
            want[5], want[7] = hdr[5], hdr[7]          # adopt the creator's smaller chunks
        if not same or hdr[:8] != want:
            self.close()
            raise SegmentMismatch(
                f"tensor {name!r}: local rank {local_rank} uses {n} x {self.dtype.name} "
                f"(local size {local_size}, chunk {chunk}, groups {groups}) but another local "
                f"rank of this host created its shared buffer with {hdr[3]} x "
                f"{_dtype_name(hdr[2])}{'' if hdr[9] == shape_tag else ' in another shape'} (local "
                f"size {hdr[4]}, chunk {hdr[7]}, groups {hdr[6]}); every "
                f"local rank must push the same shape and dtype under one name and use the same "
                f"BYTEPS_PARTITION_BYTES / BYTEPS_PCIE_SWITCH_SIZE")
        self.chunk = hdr[7]
        lay = _Layout(n, local_size, self.chunk, groups, hdr[8], self.dtype.itemsize)
        if lay.C != hdr[5] or len(buf) < lay.size:
            self.close()
            raise ValueError(f"tensor {name!r}: shared buffer {path} is truncated or corrupt "
                             f"({len(buf)} bytes); remove stale files with this prefix")
        self.C, self.W, self.span, self.size = lay.C, lay.W, lay.span, lay.size
        cnt = max(1, self.C)
        c = np.frombuffer(buf, np.int64, len(COUNTERS) * local_size * cnt, lay.off_counters)
        c = c.reshape(len(COUNTERS), local_size, cnt)
        self.copied, self.gdone, self.reduced, self.done, self.gathered = c
        self.inputs = np.frombuffer(buf, self.dtype, local_size * lay.span, lay.off_in).reshape(
            local_size, lay.span)
        self.gsum = (np.frombuffer(buf, self.dtype, groups * lay.span, lay.off_g).reshape(
            groups, lay.span) if groups > 1 else None)
        self.out = np.frombuffer(buf, self.dtype, lay.span, lay.off_out)

    @property
    def windowed(self) -> bool:
        """Whether the buffers hold fewer chunks than the tensor has (slots are reused)."""
        return self.W < self.C

    def off(self, j: int) -> int:
        """Add to element indices of chunk ``j`` to get indices into the buffers."""
        return (j % self.W - j) * self.chunk

    def slot_free(self, j: int, t: int) -> bool:
        """Whether chunk ``j`` of round ``t - 1`` may be written: its slot is no longer used
        by chunk ``j - W`` (every local rank gathered it)."""
        return j < self.W or bool((self.gathered[:, j - self.W] >= t).all())

    def _plans(self, chunk: int):
        """(chunk, window) layouts to try, best first: the whole tensor; then windows of
        two chunks (double buffering) and of one, with smaller chunks where allowed."""
        n, item = self.n, self.dtype.itemsize
        yield chunk, -(-n // chunk)
        sizes = [chunk]
        while not self.fixed_chunk and (sizes[-1] // 2) * item >= MIN_CHUNK_BYTES:
            sizes.append(sizes[-1] // 2)
        for w in (2, 1):
            for c in sizes:
                if w < -(-n // c):
                    yield c, w

    def _reserve(self, fd: int, chunk: int) -> tuple[int, int, int]:
        """Size the new file for the best layout that can be reserved; (chunk, window, size)."""
        d = os.path.dirname(self.path) or "."
        free = free_bytes(d)
        item, tried, first = self.dtype.itemsize, set(), None
        for frac in (2, 1):   # leave room for other tensors first, then take what is there
            for c, w in self._plans(chunk):
                lay = _Layout(self.n, self.L, c, self.G, w, item)
                full = w >= lay.C
                if (c, w) in tried or (not full and free is not None and
                                       lay.size > free // frac):
                    continue
                tried.add((c, w))
                try:
                    os.ftruncate(fd, lay.size)
                    os.posix_fallocate(fd, 0, lay.size)
                except OSError as exc:
                    os.ftruncate(fd, 0)
                    first = first or (lay.size, exc)
                    continue
                if not full:
                    self.fallback = (
                        f"{d} has {_mb(free or 0)} free, too little for the "
                        f"{_mb(first[0])} shared buffer of tensor {self.name!r} "
                        f"({_mb(self.n * item)} x {self.L} local ranks + result); reducing "
                        f"it through a window of {w} x {c * item // 1024} KB instead, which "
                        f"is slower. Fix: {FIX}")
                return c, w, lay.size
        lay = _Layout(self.n, self.L, chunk, self.G, 1, item)
        why = first[1].strerror if first else "no space"
        raise ShmSpaceError(
            f"tensor {self.name!r}: cannot reserve shared memory for the local reduction in "
            f"{d} ({why}; {_mb(free or 0)} free, at least {_mb(lay.size)} needed, and about "
            f"(local size + 1) x the bytes of every tensor in flight for full speed). Fix: "
            f"{FIX}, or set BYTEPS_LOCAL_REDUCE=0 to push without local reduction")

    def _create_or_open(self, header: list[int], chunk: int) -> SharedMap:
        for _ in range(5):
            got = self._create_tmp_or_open(header, chunk)
            if not isinstance(got, str):
                return got                  # another local rank published it first
            mm, self._tmp_map = self._tmp_map, None
            try:
                os.link(got, self.path)     # publish the fully written segment at once
                self.created = True
                return mm
            except FileExistsError:
                mm.close()
                self.fallback = None        # another local rank was first: use its segment
                return self._open()
            except FileNotFoundError:
                # our temporary file vanished before it was published (something that
                # cleans /dev/shm removed it): make it again
                mm.close()
            finally:
                try:
                    os.unlink(got)
                except FileNotFoundError:
                    pass
        raise ShmSpaceError(f"tensor {self.name!r}: the temporary shared buffer "
                            f"{self.path}.tmp{os.getpid()} was removed 5 times before it could "
                            f"be published; is something deleting files in its folder?")

    def _create_tmp_or_open(self, header: list[int], chunk: int) -> SharedMap | str:
        """The open segment when another local rank published it, else the path of a new
        temporary file holding the header (its map in ``self._tmp_map``)."""
        pause = 0.05
        while True:
            try:
                return self._open()      # another local rank was first: reserve nothing
            except FileNotFoundError:
                pass
            tmp = f"{self.path}.tmp{os.getpid()}"
            try:
                mm, c, w = self._create_tmp(tmp, chunk)
                break
            except ShmSpaceError:
                # local ranks that create the same segment at once both hold a reservation
                # for a moment: wait for the other one's segment, or for the space it frees
                if pause > 1.0:
                    raise
            time.sleep(pause)
            pause *= 2
        header = header[:5] + [-(-self.n // c) if self.n else 0, header[6], c, w,
                               self.shape_tag]
        np.frombuffer(mm.buf, np.int64, HEADER, 0)[:] = header
        self._tmp_map = mm
        return tmp

    def _create_tmp(self, tmp: str, chunk: int) -> tuple[SharedMap, int, int]:
        """A new file ``tmp``, reserved for the best layout that fits: (map, chunk, window)."""
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            c, w, size = self._reserve(fd, chunk)
            return SharedMap(fd, size), c, w
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)

    def _open(self) -> SharedMap:
        fd = os.open(self.path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER * 8:
                raise ValueError(f"tensor {self.name!r}: shared buffer {self.path} is truncated "
                                 f"({size} bytes); remove stale files with this prefix")
            return SharedMap(fd, size)
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
        self.copied = self.gdone = self.reduced = self.done = self.gathered = None
        self.inputs = self.gsum = self.out = None
        try:
            self.mm.close()
        except (BufferError, AttributeError):
            pass   # a view is still alive somewhere; the mapping goes with the process

"""Process sets: collectives among a subset of the workers (Horovod's ``process_set=``).

``add_process_set(ranks)`` is called by every worker with the same ranks (checked: ranks
that disagree all get an error naming them) and returns a :class:`ProcessSet` whose id is
the same on every rank.  The global set (id 0, every rank) uses the parameter servers as
every other collective does.  A smaller set cannot: a server's round waits for every
worker.  Its operations therefore travel over the worker-to-worker links of
:mod:`byteps.core.algorithms.peers` (``BYTEPS_ENABLE_PEERS=1``, the default), as a star around the
set's lowest rank (its *leader*):

1. every member sends the leader one metadata row (operation, dtype, shape, root rank,
   op, splits: the rows :mod:`byteps.core.collective.ops` exchanges on the global path), then
   its data;
2. the leader checks that the rows agree (else every member gets the same error naming
   both ranks), computes every member's result (a sum, min, max, product or average,
   a concatenation, the root's array, a block of rows) and sends each member a fixed-size
   reply header (status, result layout, received splits) and the result (or the error).

Rounds, errors and barriers are per set: each set numbers its own operations (every
member must issue the set's operations in the same order, as in Horovod), and all of a
process's set operations run in order on one thread, so a rank in two sets never waits
for itself.  Nothing received is unpickled; every header is checked (sizes, dtype codes,
dimensions) before a payload is viewed.
"""
from __future__ import annotations

import queue
import threading

import numpy as np

from byteps.core import api
from byteps.core.collective import handles as _handles
from byteps.core.node import BytePSError
from byteps.transport.wire import DTYPES, dtype_code

__all__ = ["ProcessSet", "add_initial", "add_process_set", "check_registered",
           "get_process_set", "global_process_set", "ids_and_ranks", "initial_sets",
           "remove_process_set", "resolve", "run"]

KIND = 8                       # peer message kind of process-set traffic
_MAX_DIMS = 32
_OK, _ERR = 0, 1


class ProcessSet:
    """A set of worker ranks that run collectives together (Horovod's ``ProcessSet``).

    ``ProcessSet(ranks)`` only describes the set; :func:`add_process_set` registers it
    (on every rank) and gives it its ``process_set_id``.  ``mpi_comm`` is always None
    (byteps does not use MPI); it is there because Horovod's sets print it."""

    mpi_comm = None

    def __init__(self, ranks=None):
        self._ranks = None if ranks is None else _ranks(ranks)
        self.process_set_id = None
        self.ops = 0                       # operations issued so far (the message tags)
        self.compression: dict = {}        # name -> its compression state (set_ops.py)

    @property
    def ranks(self) -> list | None:
        """The member ranks, sorted (the global set's: every rank of the job)."""
        if self.process_set_id == 0:
            return list(range(api.size())) if api.is_initialized() else None
        return self._ranks

    def size(self) -> int:
        """Number of ranks in the set."""
        return len(self._members())

    def rank(self) -> int:
        """This worker's index in the set (-1 when it is not a member)."""
        m = self._members()
        r = api.rank()
        return m.index(r) if r in m else -1

    def included(self) -> bool:
        """True when this worker is a member."""
        return api.rank() in self._members()

    def _members(self) -> list:
        if self.process_set_id == 0:
            return list(range(api.size()))
        if self._ranks is None or self.process_set_id is None:
            raise ValueError(f"{self!r} is not registered; call add_process_set() on every "
                             f"rank first")
        return self._ranks

    def __repr__(self) -> str:            # Horovod's form (its suites compare the strings)
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


global_process_set = ProcessSet()
global_process_set.process_set_id = 0
_SETS: dict[int, ProcessSet] = {}
_RETIRED_OPS: dict[int, int] = {}  # id of a removed set -> its operation count (the next tag)
_lock = threading.Lock()


def _ranks(ranks) -> list:
    if hasattr(ranks, "ranks") and isinstance(ranks, ProcessSet):
        ranks = ranks.ranks
    try:
        out = sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        raise ValueError(f"process set ranks must be integers, got {ranks!r}") from None
    if not out or len(set(out)) != len(out):
        raise ValueError(f"process set ranks must be distinct and not empty, got {ranks!r}")
    return out


def add_process_set(ranks) -> ProcessSet:
    """Register the set of ``ranks`` (a list or a :class:`ProcessSet`) on every rank.

    Every worker must call it, in the same order, with the same ranks; ranks that pass
    different ones get an error naming both.  Returns the registered set."""
    ps = ranks if isinstance(ranks, ProcessSet) else ProcessSet(ranks)
    if ps.process_set_id == 0:
        raise ValueError("add_process_set: hvd.global_process_set is always registered")
    if ps.ranks is None:
        raise ValueError("add_process_set: give the ranks of the set")
    n = api.size()
    bad = [r for r in ps.ranks if not 0 <= r < n]
    if bad:
        raise ValueError(f"add_process_set: ranks {bad} are out of range for a job of {n} "
                         f"worker(s)")
    _agree("add_process_set", ps.ranks)
    with _lock:
        if ps.ranks == list(range(n)):
            raise ValueError("add_process_set: a set of every rank is the global process set "
                             "(hvd.global_process_set)")
        dup = [s for s in _SETS.values() if s.ranks == ps.ranks]
        if dup:
            raise ValueError(f"add_process_set: {dup[0]!r} already has ranks {ps.ranks}")
        # the lowest free id, as Horovod's; a reused id's operations go on numbering where
        # the removed set's stopped, so no message of the old set can pass for the new one's
        pid = next(i for i in range(1, len(_SETS) + 2) if i not in _SETS)
        ps.process_set_id, ps.ops, ps.compression = pid, _RETIRED_OPS.pop(pid, 0), {}
        _SETS[pid] = ps
    return ps


def initial_sets(sets) -> list:
    """``init(process_sets=[...])``'s list as ProcessSets, checked before the job is joined:
    a set listed twice (the order of its ranks does not matter) is a ValueError on every
    rank, and nothing is registered."""
    if isinstance(sets, (ProcessSet, str, bytes)) or not hasattr(sets, "__iter__"):
        raise ValueError(f"init(process_sets=...) takes a list of ProcessSets or rank lists, "
                         f"or 'dynamic'; got {sets!r}")
    out = [s if isinstance(s, ProcessSet) else ProcessSet(s) for s in sets]
    seen: dict = {}
    for i, ps in enumerate(out):
        if ps.process_set_id == 0:
            continue                    # hvd.global_process_set: always there
        if ps.ranks is None:
            raise ValueError(f"init(process_sets=...): entry {i} ({ps!r}) has no ranks")
        key = tuple(ps.ranks)
        if key in seen:
            raise ValueError(f"init(process_sets=...): entries {seen[key]} and {i} are the same "
                             f"set of ranks {list(key)}; list each set once")
        seen[key] = i
    return [ps for ps in out if ps.process_set_id != 0]


def add_initial(sets: list) -> None:
    """Register :func:`initial_sets`' sets after ``init()``, in order (every rank passes the
    same).  A set of every rank duplicates the global set and a rank beyond the job's size
    does not exist: both are refused before any of them is registered."""
    n = api.size()
    for ps in sets:
        if ps.ranks == list(range(n)):
            raise ValueError(f"init(process_sets=...): {ps.ranks} is every rank of the job, "
                             f"the global process set (hvd.global_process_set); drop it")
        bad = [r for r in ps.ranks if not 0 <= r < n]
        if bad:
            raise ValueError(f"init(process_sets=...): ranks {bad} are out of range for a job "
                             f"of {n} worker(s)")
    for ps in sets:
        if ps.process_set_id is None or _SETS.get(ps.process_set_id) is not ps:
            add_process_set(ps)


def ids_and_ranks() -> dict:
    """Every registered set's id and ranks, the global set's (0) included (Horovod's
    ``_get_process_set_ids_and_ranks``)."""
    with _lock:
        out = {pid: list(s.ranks) for pid, s in sorted(_SETS.items())}
    return {0: list(range(api.size())), **out}


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` on every rank (every worker calls it); False for the
    global set or a set that is not registered."""
    pid = getattr(process_set, "process_set_id", None)
    if pid in (None, 0) or pid not in _SETS:
        return False
    _agree("remove_process_set", [pid])
    with _lock:
        gone = _SETS.pop(pid, None)
        if gone is not None:
            _RETIRED_OPS[pid] = gone.ops
            gone.compression = {}
    process_set.process_set_id = None
    return True


def get_process_set(pid: int) -> ProcessSet:
    """The registered set with id ``pid``."""
    if pid == 0:
        return global_process_set
    try:
        return _SETS[pid]
    except KeyError:
        raise ValueError(f"no process set with id {pid} (registered: "
                         f"{sorted(_SETS)})") from None


def depart(why: str) -> None:
    """This rank leaves the membership (shutdown(), or its own wait failed): the other
    members of its sets (and every peer it talks to) learn it at once over the
    worker-to-worker links, so their set operations fail naming it, as the servers fail
    the global set's rounds of a rank that left; this rank's own set waits end."""
    from byteps.core import state as _st
    st = _st.current()
    peers = getattr(st, "peers", None)
    if peers is None or peers.leaving is not None:
        return
    with _lock:
        ranks = {r for s in _SETS.values() for r in s.ranks}
    try:
        peers.announce_leave(f"worker rank {st.rank} {why}"[:1000], ranks)
    except Exception as exc:        # leaving goes on; the others' links notice it later
        import logging
        logging.getLogger(__name__).warning("cannot tell the set members that this rank "
                                            "leaves: %s", exc)


def reset() -> None:
    """Forget every set (shutdown; the other members are told first, :func:`depart`)."""
    depart("left the job (called shutdown())")
    with _lock:
        for ps in _SETS.values():
            ps.process_set_id, ps.compression = None, {}
        _SETS.clear()
        _RETIRED_OPS.clear()


def _agree(what: str, values: list) -> None:
    """Every rank passes the same ``values`` (checked with one global sum)."""
    n, r = api.size(), api.rank()
    if n == 1:
        return
    meta = np.zeros((n, 2 + n), np.int64)
    meta[r, 0], meta[r, 1] = len(values), api.size()
    row = np.full(n, -1, np.int64)
    row[:len(values)] = values[:n]
    meta[r, 2:] = row
    # the name carries the layout (it follows the size): one key for every rank of an
    # elastic job, newcomers included (ops._meta_start)
    got = api.push_pull(meta, f"process_set.{what}.{n}", average=False)
    for k in range(1, n):
        if not np.array_equal(got[k], got[0]):
            show = [int(v) for v in got[k, 2:2 + int(got[k, 0])]]
            show0 = [int(v) for v in got[0, 2:2 + int(got[0, 0])]]
            raise BytePSError(f"{what}: rank {k} passed {show} but rank 0 passed {show0}; "
                              f"every rank must call {what} with the same ranks, in the same "
                              f"order")


def check_registered(process_set, what: str) -> None:
    """ValueError naming ``what`` unless ``process_set`` is a registered set (or the global
    one); membership is checked when the operation runs (:func:`resolve`)."""
    if getattr(process_set, "process_set_id", None) == 0:
        return
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a ProcessSet, got {process_set!r}")
    pid = process_set.process_set_id
    if pid is None or _SETS.get(pid) is not process_set:
        raise ValueError(f"{what}: {process_set!r} is not registered (or was removed); call "
                         f"add_process_set() on every rank")


def resolve(process_set) -> ProcessSet | None:
    """None for the global set (the servers' path); the registered set otherwise.
    Raises ValueError when this rank is not a member."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return None
    check_registered(process_set, "process_set")
    if api.rank() not in process_set.ranks:
        raise ValueError(f"rank {api.rank()} is not a member of {process_set!r}: only its "
                         f"ranks may call its operations")
    return process_set


# ------------------------------------------------------------------ the star
class _Worker:
    """One thread per process that runs the set operations in the order they were
    issued (see the module docstring)."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="bps-process-sets", daemon=True).start()

    def _loop(self):
        while True:
            fn = self.q.get()
            fn()


_worker: list = []


def run(ps: ProcessSet, row: np.ndarray, data: np.ndarray, compute, finish, what: str,
        frame_bytes: int | None = None):
    """One set operation: returns a function that waits for and returns its result.

    ``row``: this rank's metadata row (int64, the same length on every member);
    ``data``: its array (with ``frame_bytes``: a compressed frame of exactly that many
    bytes, uint8, while ``row`` describes the tensor it encodes); ``compute(rows, arrays,
    ranks)`` (on the leader) returns every member's ``(result array, extra int64 row)`` or
    raises BytePSError;
    ``finish(result, extra)`` turns the reply into the caller's result."""
    st = api._state()
    with _lock:
        tag = ps.ops
        ps.ops += 1
        if not _worker:
            _worker.append(_Worker())
    done, box = threading.Event(), {}

    def job():
        try:
            box["r"] = _exchange(st, ps, tag, row, data, compute, finish, what, frame_bytes)
        except BaseException as exc:
            box["e"] = exc
        finally:
            done.set()
    _worker[0].q.put(job)

    def wait():
        end = _handles.deadline(st)          # BYTEPS_COLLECTIVE_TIMEOUT_S
        try:
            while not done.wait(0.5):
                _handles.check_deadline(end, what, st)
        except _handles.CollectiveTimeoutError as exc:
            _handles.interrupted(exc, what, st)
            raise
        if "e" in box:
            raise box["e"]
        return box["r"]
    return wait


def _exchange(st, ps, tag, row, data, compute, finish, what, frame_bytes=None):
    ranks, me = ps.ranks, st.rank
    leader = ranks[0]
    slot = (1 << 31) - 1 - ps.process_set_id
    net = st.peers
    if len(ranks) > 1 and net is None:
        raise BytePSError(f"{what} on {ps!r}: process sets need the worker-to-worker links; "
                          f"run every worker with BYTEPS_ENABLE_PEERS=1 (the default)")
    data = np.ascontiguousarray(data)
    hdr_len = 4 + _MAX_DIMS + len(ranks)
    if me != leader:
        net.send(leader, tag * 4, slot, KIND, 0, row)
        net.send(leader, tag * 4 + 1, slot, KIND, 0, data)
        hdr = np.frombuffer(net.recv(leader, tag * 4 + 2, slot, KIND, 0, hdr_len * 8, what),
                            np.int64).copy()
        status, nbytes, code, ndim = (int(v) for v in hdr[:4])
        if status not in (_OK, _ERR) or not 0 <= nbytes < 1 << 40 or \
                not 0 <= ndim <= _MAX_DIMS or not 0 <= code < len(DTYPES):
            raise BytePSError(f"{what}: malformed reply from the set's leader (rank {leader})")
        payload = net.recv(leader, tag * 4 + 3, slot, KIND, 0, nbytes, what)
        if status == _ERR:
            raise BytePSError(bytes(payload).decode("utf-8", "replace"))
        shape = tuple(int(v) for v in hdr[4:4 + ndim])
        if any(s < 0 for s in shape) or \
                int(np.prod(shape, dtype=np.int64)) * DTYPES[code].itemsize != nbytes:
            raise BytePSError(f"{what}: reply from the set's leader (rank {leader}) has "
                              f"{nbytes} bytes for shape {shape}")
        res = np.frombuffer(payload, DTYPES[code]).reshape(shape).copy()
        return finish(res, hdr[4 + _MAX_DIMS:].copy())
    rows, arrays = [row], [data]
    err, results = None, None
    try:           # a member that left fails the operation on every other member
        for r in ranks[1:]:
            got = net.recv(r, tag * 4, slot, KIND, 0, row.nbytes, what)
            rows.append(np.frombuffer(got, np.int64).copy())
        meta = np.stack(rows)
        for i, r in enumerate(ranks[1:], 1):
            arrays.append(_payload(net, r, tag, slot, meta[i], what, frame_bytes))
        results = compute(meta, arrays, ranks)
    except BytePSError as exc:
        err = str(exc)
    for i, r in enumerate(ranks[1:], 1):
        hdr = np.zeros(hdr_len, np.int64)
        if r in net.left or net.leaving is not None:
            continue
        if err is not None:
            msg = np.frombuffer(err.encode(), np.uint8)
            hdr[:2] = [_ERR, msg.nbytes]
            net.send(r, tag * 4 + 2, slot, KIND, 0, hdr)
            net.send(r, tag * 4 + 3, slot, KIND, 0, msg)
            continue
        res, extra = results[i]
        res = np.ascontiguousarray(res)
        hdr[:4] = [_OK, res.nbytes, dtype_code(res.dtype, what), res.ndim]
        hdr[4:4 + res.ndim] = res.shape
        if extra is not None:
            hdr[4 + _MAX_DIMS:4 + _MAX_DIMS + len(extra)] = extra
        net.send(r, tag * 4 + 2, slot, KIND, 0, hdr)
        net.send(r, tag * 4 + 3, slot, KIND, 0, res)
    if err is not None:
        raise BytePSError(err)
    res, extra = results[0]
    out_extra = np.zeros(len(ranks), np.int64)
    if extra is not None:
        out_extra[:len(extra)] = extra
    return finish(np.ascontiguousarray(res), out_extra)


def _payload(net, r, tag, slot, row, what, frame_bytes=None) -> np.ndarray:
    """The data a member sent, sized from its own metadata row (checked first), or its
    compressed frame of ``frame_bytes`` (a member with other settings sent another size:
    the error names it)."""
    from byteps.core.collective import ops as c
    if frame_bytes is not None:
        return np.frombuffer(net.recv(r, tag * 4 + 1, slot, KIND, 0, frame_bytes, what),
                             np.uint8).copy()
    code, ndim = int(row[c._DTYPE]), int(row[c._NDIM])
    if not 0 <= code < len(DTYPES) or not 0 <= ndim <= _MAX_DIMS:
        raise BytePSError(f"{what}: rank {r} sent a malformed metadata row")
    shape = tuple(int(v) for v in row[c._DIMS:c._DIMS + ndim])
    if any(s < 0 for s in shape):
        raise BytePSError(f"{what}: rank {r} sent a malformed shape {shape}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[code].itemsize
    buf = net.recv(r, tag * 4 + 1, slot, KIND, 0, nbytes, what)
    return np.frombuffer(buf, DTYPES[code]).reshape(shape).copy()

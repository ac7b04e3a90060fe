"""The wire format: one msgpack header frame, one MAC frame, raw payload frames.

Header (a msgpack array, validated field by field on receipt)::

    [version, job_id, sender, op, epoch, seq, body]

* ``version``  int   PROTOCOL_VERSION
* ``job_id``   str   the job this message belongs to
* ``sender``   int   node id assigned by the scheduler (-1 before registration)
* ``op``       int   one of :class:`Op`
* ``epoch``    int   membership epoch (bumped when workers re-form the group)
* ``seq``      int   per-sender sequence number: strictly increasing on each
  (sender, receiver) stream; counters start at :func:`new_seq` (monotonic
  clock nanoseconds), so they also increase across re-initialisations.  Receivers
  drop a frame whose seq is not above the last one they accepted (replay).
* ``body``     map (control ops) or ``[entries, decls]`` (DATA / RESULT)

A declaration is ``[key, name, shape, dtype, rank, compression]`` or, for a reduction
other than a sum, ``[key, name, shape, dtype, rank, compression, op]`` (``op`` an index
into :data:`REDUCE_OPS`), or, for a key whose server runs an outer optimizer (DiLoCo,
version 5), ``[..., compression, op, outer]`` with ``outer = [lr, momentum, nesterov]``
(checked by :func:`outer_field`): sent with a
tensor's first push to a server so that the server can fix and check its layout;
``compression`` is ``[]`` or the compressor settings as ``[[name, value], ...]``
(validated by :meth:`byteps.compression.Spec.from_wire`).
A data entry is ``[key, part, round, flags, dtype, length]``; an entry with
payload (a push, or a result) is followed by exactly one payload frame of
``length * itemsize`` bytes, or, with flag COMP, of exactly the compressor's
frame size for ``length`` elements (checked by the receiver's pipeline), or, with
flags COMP and NONFINITE (version 6), of zero bytes: a compressed partition that held inf or
NaN, whose round's result is NaN on every rank.
Nothing received is ever unpickled or evaluated.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import time

from typing import NamedTuple

import msgpack
import numpy as np

PROTOCOL_VERSION = 6
MAX_HEADER_BYTES = 1 << 20
MAX_ENTRIES = 65536


class Op(enum.IntEnum):
    REGISTER = 1        # node -> scheduler
    REGISTER_OK = 2     # scheduler -> node: id, rank, address book
    REFUSED = 3         # scheduler -> node: reason
    BARRIER = 4
    BARRIER_DONE = 5
    HEARTBEAT = 6
    HEARTBEAT_ACK = 7
    NODE_DEAD = 8       # scheduler -> all: a node died
    LEAVE = 9           # worker -> scheduler: shutdown() (may re-init)
    EXIT = 10           # worker -> scheduler: process ends
    TERMINATE = 11      # scheduler -> all: job over (body: reason, ok)
    HELLO = 12          # worker -> server after registration
    HELLO_OK = 13
    JOIN = 14           # worker -> scheduler: join() (out of data; body: {})
    JOIN_DONE = 15      # scheduler -> worker: every worker joined (last_rank) or error
    LOST = 16           # bpslaunch -> scheduler: a process it started died (role mode;
                        # body checked by byteps/scheduler/lost.py)
    DATA = 20           # worker -> server: entries (push and/or pull)
    RESULT = 21         # server -> worker: entries with payload (or acks)
    DATA_ERROR = 22     # server -> workers: a key failed (body: keys, message)
    STALL = 23          # server -> scheduler: stall report
    MEMBERS = 24        # scheduler -> server: joined ranks, ranks gone, round reset (id)
    MEMBERS_OK = 25     # server -> scheduler: MEMBERS applied (id)
    REPLICA = 40        # server -> its backup server: [entries, decls, ranks] + payloads
    REPLICA_OK = 41     # backup -> server: [entries, []] (what it stored; no payload)
    FAILOVER = 42       # scheduler -> all: a server died, its backup owns its keys (dead, reason)
    PEER = 26           # worker -> worker: decentralized algorithms (core/algorithms/peers.py)
    FREE = 27           # worker -> server: keys this worker no longer uses ({keys}, checked
                        # by free_body; byteps/server/retire.py)
    ELASTIC = 30        # scheduler -> worker: membership change (gen, removed, reason);
                        # body checked by elastic_body (docs/fault_tolerance.md)


# entry flags
PUSH = 1
PULL = 2
ACK = 4          # server acknowledges a push (no payload)
SHM = 8          # payload is in a shared-memory segment (colocated peers), not a frame
COMP = 16        # payload is a compressed frame (byteps.compression), not raw elements
ASYNC = 32       # asynchronous key (BYTEPS_ENABLE_ASYNC=1): the push is added to the stored
                 # value at once, the pull returns the current value (byteps/server/staleness.py)
AVG = 64         # push: the worker averages (float); result: the server already did (average)
NONFINITE = 128  # COMP only, an empty frame: push: the partition held inf or NaN, which the
                 # compressor cannot encode; result: that round's sum is NaN (every rank)
MAX_COMP_PAIRS = 16



def average(src: np.ndarray, n: int, out: np.ndarray) -> None:
    """``out = src / n``, the one averaging rule of workers and servers (AVG): a float
    multiplied by 2**-k is bit-identical to the division by 2**k, and faster."""
    if out.dtype.kind == "f" and not n & (n - 1):
        np.multiply(src, 1.0 / n, out=out)
    elif out.dtype.kind == "f":
        np.divide(src, n, out=out)
    else:
        np.floor_divide(src, n, out=out)


# element-wise reductions a server applies to the pushes of a round (declaration field 6)
REDUCE_OPS = ("sum", "min", "max", "product")

DTYPES = [np.dtype(t) for t in ("float32", "float64", "float16", "int32", "int64",
                                "uint8", "int8")]
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
DTYPE_NAMES = ", ".join(d.name for d in DTYPES)


class Entry(NamedTuple):
    """A data entry ``[key, part, round, flags, dtype, length]`` with named fields; msgpack
    sends it as that list (``Entry._make(e)`` names the fields of one received and
    validated by :func:`decode`)."""

    key: int
    part: int
    round: int
    flags: int       # PUSH, PULL, ACK, SHM, COMP, ASYNC, AVG, NONFINITE
    dtype: int       # index into DTYPES
    length: int      # elements


class WireError(ValueError):
    """A received message is malformed; it is dropped."""


class VersionMismatch(WireError):
    """An authenticated header of another protocol version (the scheduler refuses it)."""

    def __init__(self, version, job_id, op):
        super().__init__(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
        self.version, self.job_id, self.op = version, job_id, op


def new_seq() -> int:
    """Start value of a sequence counter: above every counter this process started before.

    The monotonic clock in nanoseconds never steps back (unlike the wall clock)
    and outruns any message counter.
    """
    return time.monotonic_ns()


def dtype_code(dt: np.dtype, tensor_name: str = "") -> int:
    try:
        return DTYPE_CODE[np.dtype(dt)]
    except (KeyError, TypeError):
        raise TypeError(f"tensor {tensor_name!r}: dtype {dt} is not supported by BytePS; "
                        f"use one of {DTYPE_NAMES}") from None


MAC_BYTES = 16


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_MAC_KEYS: dict = {}         # secret -> (inner, outer) SHA-256 states with the key absorbed


def _mac_key(secret: bytes) -> tuple:
    st = _MAC_KEYS.get(secret)
    if st is None:              # RFC 2104: a key longer than the block is hashed first
        k = (hashlib.sha256(secret).digest() if len(secret) > 64 else secret).ljust(64, b"\0")
        st = (hashlib.sha256(k.translate(_IPAD)), hashlib.sha256(k.translate(_OPAD)))
        if len(_MAC_KEYS) < 64:
            _MAC_KEYS[secret] = st
    return st


def mac(secret: bytes | None, header: bytes) -> bytes:
    """HMAC-SHA256 of a header under the job secret, truncated to MAC_BYTES (b"" without).

    Computed from SHA-256 states that already absorbed the padded key (the same bytes as
    ``hmac.digest``; 1.5 instead of 3.8 us a message, on every message of every role)."""
    if not secret:
        return b""
    inner, outer = _mac_key(secret)
    i = inner.copy()
    i.update(header)
    o = outer.copy()
    o.update(i.digest())
    return o.digest()[:MAC_BYTES]


def encode(job_id: str, sender: int, op: int, epoch: int, seq: int, body,
           secret: bytes | None = None) -> list:
    """Header + MAC frames for a message (payload frames are appended by the caller)."""
    hdr = msgpack.packb([PROTOCOL_VERSION, job_id, sender, int(op), epoch, seq, body],
                        use_bin_type=True)
    return [hdr, mac(secret, hdr)]


class Header:
    __slots__ = ("version", "job_id", "sender", "op", "epoch", "seq", "body")

    def __init__(self, version, job_id, sender, op, epoch, seq, body):
        self.version, self.job_id, self.sender, self.op = version, job_id, sender, op
        self.epoch, self.seq, self.body = epoch, seq, body

    def __repr__(self) -> str:
        return (f"Header(op={Op(self.op).name}, sender={self.sender}, epoch={self.epoch}, "
                f"seq={self.seq})")


def _is_int(v) -> bool:
    return type(v) is int


def decode(frames: list, job_id: str, secret: bytes | None,
           check_job: bool = True) -> tuple[Header, list]:
    """Validate and decode ``[header, mac, payload...]``; raise WireError if bad.

    The MAC is checked before the header is parsed, and before any payload
    frame is looked at.
    """
    if len(frames) < 2:
        raise WireError(f"{len(frames)} frame(s); expected header + mac")
    if len(frames[0]) > MAX_HEADER_BYTES:       # sizes first: nothing big is copied
        raise WireError(f"header of {len(frames[0])} bytes exceeds {MAX_HEADER_BYTES}")
    if secret and len(frames[1]) != MAC_BYTES:
        raise WireError("bad or missing credential (BYTEPS_JOB_SECRET mismatch?)")
    hdr_b = _bytes(frames[0])
    if secret:
        if not hmac.compare_digest(_bytes(frames[1]), mac(secret, hdr_b)):
            raise WireError("bad or missing credential (BYTEPS_JOB_SECRET mismatch?)")
    try:
        h = msgpack.unpackb(hdr_b, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types
        raise WireError(f"header is not valid msgpack: {type(exc).__name__}") from None
    if isinstance(h, list) and h and _is_int(h[0]) and h[0] != PROTOCOL_VERSION:
        raise VersionMismatch(h[0], h[1] if len(h) > 1 and isinstance(h[1], str) else None,
                              h[3] if len(h) > 3 and _is_int(h[3]) else None)
    if not isinstance(h, list) or len(h) != 7:
        raise WireError("header must be a 7-element array")
    version, job, sender, op, epoch, seq, body = h
    if not _is_int(version) or version != PROTOCOL_VERSION:
        raise WireError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    if not isinstance(job, str) or (check_job and job != job_id):
        raise WireError(f"job id {job!r} does not match this job ({job_id!r})")
    if not _is_int(sender) or not -1 <= sender < 1 << 31:
        raise WireError(f"bad sender {sender!r}")
    if not _is_int(op) or op not in Op._value2member_map_:
        raise WireError(f"unknown op {op!r}")
    if not _is_int(epoch) or not 0 <= epoch < 1 << 31:
        raise WireError(f"bad epoch {epoch!r}")
    if not _is_int(seq) or not 0 <= seq < 1 << 63:
        raise WireError(f"bad seq {seq!r}")
    if op in (Op.DATA, Op.RESULT, Op.REPLICA_OK):
        _check_entries(body)
    elif op == Op.REPLICA:
        _check_replica(body)
    elif not isinstance(body, dict):
        raise WireError(f"{Op(op).name} body must be a map")
    return Header(version, job, sender, op, epoch, seq, body), frames[2:]


def _check_entries(body) -> None:
    if not isinstance(body, list) or len(body) != 2:
        raise WireError("data body must be [entries, decls]")
    entries, decls = body
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise WireError("data entries must be an array of at most %d entries" % MAX_ENTRIES)
    if not isinstance(decls, list) or len(decls) > MAX_ENTRIES:
        raise WireError("data decls must be an array")
    for d in decls:
        if not (isinstance(d, list) and len(d) in (6, 7, 8) and _comp_shape(d[5])
                and (len(d) == 6 or (_is_int(d[6]) and 0 <= d[6] < len(REDUCE_OPS)))
                and (len(d) < 8 or _outer_ok(d[7]))
                and _is_int(d[0]) and 0 <= d[0] < 1 << 63
                and isinstance(d[1], str) and len(d[1]) < 4096 and isinstance(d[2], list)
                and len(d[2]) <= 32 and all(_is_int(x) and 0 <= x < 1 << 40 for x in d[2])
                and _is_int(d[3]) and 0 <= d[3] < len(DTYPES)
                and _is_int(d[4]) and 0 <= d[4] < 1 << 31):
            raise WireError("bad declaration (want [key, name, shape, dtype, rank, "
                            "compression], [..., compression, op] or [..., op, outer])")
    ndt = len(DTYPES)
    for e in entries:                  # unrolled: this runs for every partition received
        if type(e) is not list or len(e) != 6:
            raise WireError("data entry must be 6 integers [key, part, round, flags, dtype, len]")
        key, part, rnd, flags, dt, length = e
        if not (type(key) is int and type(part) is int and type(rnd) is int
                and type(flags) is int and type(dt) is int and type(length) is int):
            raise WireError("data entry must be 6 integers [key, part, round, flags, dtype, len]")
        if not (0 <= key < 1 << 63 and 0 <= part < 1 << 31 and 0 <= rnd < 1 << 62
                and 0 <= flags < 256 and 0 <= dt < ndt and 0 <= length < 1 << 40):
            raise WireError(f"data entry out of range: {e}")
        if flags & NONFINITE and not flags & COMP:
            raise WireError(f"data entry {e}: NONFINITE without COMP")


def _check_replica(body) -> None:
    """REPLICA (byteps/server/replica.py): ``[entries, decls, ranks]``, one rank per entry
    (-1 for a finished round, else the rank whose asynchronous push is forwarded); every
    entry is followed by exactly one payload frame."""
    if not isinstance(body, list) or len(body) != 3:
        raise WireError("replica body must be [entries, decls, ranks]")
    _check_entries(body[:2])
    ranks = body[2]
    if not (isinstance(ranks, list) and len(ranks) == len(body[0])
            and all(_is_int(r) and -1 <= r < 1 << 31 for r in ranks)):
        raise WireError("replica ranks must be one integer in [-1, 2**31) per entry")
    for e in body[0]:
        if e[3] & (ACK | SHM):
            raise WireError(f"replica entry {e} has flag ACK or SHM (its payload travels "
                            f"in a frame)")


def _outer_ok(o) -> bool:
    """A declaration's outer-optimizer field (DiLoCo): ``[lr, momentum, nesterov]``."""
    try:
        outer_field(o)
    except WireError:
        return False
    return True


def outer_field(o) -> tuple[float, float, bool]:
    """Validate a declaration's outer-optimizer field ``[lr, momentum, nesterov]`` (the
    servers hold the key's parameters and apply this Nesterov/heavy-ball SGD step to the
    averaged outer gradient of every round, byteps/server/outer.py): ``lr`` a finite float
    in (0, 1000], ``momentum`` a float in [0, 1), ``nesterov`` a bool.  Raises WireError."""
    if not (isinstance(o, list) and len(o) == 3):
        raise WireError("outer field must be [lr, momentum, nesterov]")
    lr, mu, nesterov = o
    if not (type(lr) in (int, float) and 0 < lr <= 1000):
        raise WireError(f"outer lr {lr!r} must be a number in (0, 1000]")
    if not (type(mu) in (int, float) and 0 <= mu < 1):
        raise WireError(f"outer momentum {mu!r} must be a number in [0, 1)")
    if type(nesterov) is not bool:
        raise WireError(f"outer nesterov {nesterov!r} must be a bool")
    return float(lr), float(mu), nesterov


def _comp_shape(c) -> bool:
    """A declaration's compression field: [] or a short list of [str, scalar] pairs."""
    return isinstance(c, list) and len(c) <= MAX_COMP_PAIRS and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and len(p[0]) <= 32
        and (p[1] is None or isinstance(p[1], (bool, int, float))
             or (isinstance(p[1], str) and len(p[1]) <= 32)) for p in c)


def failover_body(body: dict) -> tuple[dict, str]:
    """Validate a FAILOVER body ``{dead, reason}`` (byteps/scheduler/failover.py):
    ``dead`` names the server (node_id, address, host, host_id: strings or None, pid, rank:
    integers or None), ``reason`` is a string of at most 4000 characters.  Raises
    WireError."""
    if not isinstance(body, dict) or set(body) != {"dead", "reason"}:
        raise WireError("FAILOVER body must be {dead, reason}")
    dead, reason = body["dead"], body["reason"]
    if not isinstance(dead, dict) or not (_is_int(dead.get("node_id"))
                                          and 0 <= dead["node_id"] < 1 << 31):
        raise WireError("FAILOVER dead must name the server's node_id")
    for k, v in dead.items():
        if k in ("role", "host", "host_id", "address"):
            if not (v is None or (isinstance(v, str) and len(v) <= 300)):
                raise WireError(f"FAILOVER dead.{k} must be a short string")
        elif k in ("pid", "rank"):
            if not (v is None or _is_int(v)):
                raise WireError(f"FAILOVER dead.{k} must be an integer")
        elif k != "node_id":
            raise WireError(f"FAILOVER dead has an unknown field {k!r}")
    if not isinstance(reason, str) or len(reason) > 4000:
        raise WireError("FAILOVER reason must be a string of at most 4000 characters")
    return dead, reason


def elastic_body(body: dict) -> tuple[int, bool, str]:
    """Validate an ELASTIC body ``{gen, removed, reason}``: (gen, removed, reason).

    ``gen`` counts the membership changes the scheduler announced (0 < gen < 2**31),
    ``removed`` is true when a worker was lost (pending rounds cannot complete), and
    ``reason`` names the change (at most 4000 characters).  Raises WireError."""
    if not isinstance(body, dict) or set(body) != {"gen", "removed", "reason"}:
        raise WireError("ELASTIC body must be {gen, removed, reason}")
    gen, removed, reason = body["gen"], body["removed"], body["reason"]
    if not (_is_int(gen) and 0 < gen < 1 << 31):
        raise WireError(f"ELASTIC gen {gen!r} must be an int in 1..2**31-1")
    if type(removed) is not bool:
        raise WireError(f"ELASTIC removed {removed!r} must be a bool")
    if not isinstance(reason, str) or len(reason) > 4000:
        raise WireError("ELASTIC reason must be a string of at most 4000 characters")
    return gen, removed, reason


MAX_FREE_KEYS = 4096     # keys per FREE message (a worker sends more in several)


def free_body(body: dict) -> list[int]:
    """Validate a FREE body ``{keys}`` (worker -> server, byteps/server/retire.py): the
    partition keys autotune left behind on this worker, 1 to MAX_FREE_KEYS distinct
    63-bit integers.  Raises WireError."""
    if not isinstance(body, dict) or set(body) != {"keys"}:
        raise WireError("FREE body must be {keys}")
    keys = body["keys"]
    if not (isinstance(keys, list) and 0 < len(keys) <= MAX_FREE_KEYS):
        raise WireError(f"FREE keys must be a list of 1 to {MAX_FREE_KEYS} keys")
    if not all(_is_int(k) and 0 <= k < 1 << 63 for k in keys):
        raise WireError("FREE keys must be integers in [0, 2**63)")
    if len(set(keys)) != len(keys):
        raise WireError("FREE keys must be distinct")
    return keys


def payload_count(entries: list, op: int) -> int:
    """How many payload frames the entries of a DATA/RESULT message announce."""
    if op == Op.DATA:
        return sum(1 for e in entries if e[3] & PUSH and not e[3] & SHM)
    if op == Op.REPLICA:
        return len(entries)
    return sum(1 for e in entries if not e[3] & (ACK | SHM))


def entry_array(entry: list, frame) -> np.ndarray:
    """View a payload frame as the entry's array (zero copy); check its size."""
    dt = DTYPES[entry[4]]
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    if buf.nbytes != entry[5] * dt.itemsize:
        raise WireError(f"payload of {buf.nbytes} bytes for entry {entry} "
                        f"(expected {entry[5] * dt.itemsize})")
    return np.frombuffer(buf, dtype=dt)


def frame_bytes(frame) -> memoryview:
    """A payload frame's bytes as a memoryview (zero copy) for a compressed entry."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _bytes(frame) -> bytes:
    if isinstance(frame, (bytes, bytearray)):
        return bytes(frame)
    return frame.bytes

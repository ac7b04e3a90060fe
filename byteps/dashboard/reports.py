"""A worker's heartbeat report (byteps/core/api/reporter.py), validated field by field, and
straggler attribution over the reports of every rank.

Nothing here trusts the network: :func:`clean` keeps only the known fields, each checked for
its type and range (strings cut to a bound length), and raises ValueError naming the first
bad field; a report is data to show, never code or a pickle.  (Every rejection is a ValueError,
wrong types included: the caller drops the report whatever was wrong with it.)
"""
from __future__ import annotations

import math

MAX_SERVERS = 4096
MAX_THREADS = 16
MAX_FRAMES = 12

# field -> (type, lo, hi): numbers checked for range, strings for length (hi)
_NUM = {"step": (int, 0, 1 << 62), "step_ms": (float, 0.0, 1e9), "wait_ms": (float, 0.0, 1e9),
        "MBps": (float, 0.0, 1e9), "bytes": (int, 0, 1 << 62),
        "bytes_step": (int, 0, 1 << 62), "pid": (int, 0, 1 << 31),
        "in_step_s": (float, 0.0, 1e9), "inflight": (int, 0, 1 << 31),
        "ratio": (float, 0.0, 1e6), "waiting_s": (float, 0.0, 1e9),
        "push_ms": (float, -1.0, 1e9)}
_STR = {"last": 200, "comp": 200, "mode": 10, "waiting": 200, "trace": 300}


def _number(name: str, v, kind, lo, hi):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
            (kind is int and not isinstance(v, int)):
        raise ValueError(f"field {name!r} must be a {kind.__name__}, got {type(v).__name__}")
    if isinstance(v, float) and not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"field {name!r} out of range: {v!r}")
    return kind(v)


def _text(name: str, v, limit: int) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError(f"field {name!r} must be a string of at most {limit} characters")
    return v


def clean(rep) -> dict:
    """The validated report (known fields only); raises ValueError naming a bad field."""
    if not isinstance(rep, dict):
        raise ValueError("a report must be a map")  # noqa: TRY004
    out: dict = {}
    for name, (kind, lo, hi) in _NUM.items():
        if name in rep:
            out[name] = _number(name, rep[name], kind, lo, hi)
    for name, limit in _STR.items():
        if name in rep:
            out[name] = _text(name, rep[name], limit)
    if "trace_written" in rep:
        if not isinstance(rep["trace_written"], bool):
            raise ValueError("field 'trace_written' must be true or false")
        out["trace_written"] = rep["trace_written"]
    if "srv_ms" in rep:
        srv = rep["srv_ms"]
        if not isinstance(srv, list) or len(srv) > MAX_SERVERS:
            raise ValueError("field 'srv_ms' must be a list of at most 4096 numbers")
        out["srv_ms"] = [_number("srv_ms", v, float, -1.0, 1e9) for v in srv]
    if "tune" in rep:
        out["tune"] = _tune(rep["tune"])
    if "stacks" in rep:
        out["stacks"] = _stacks(rep["stacks"])
    return out


def _tune(t) -> dict:
    if not isinstance(t, dict):
        raise ValueError("field 'tune' must be a map")  # noqa: TRY004
    out: dict = {}
    if "state" in t:
        out["state"] = _text("tune.state", t["state"], 40)
    for name in ("partition_bytes", "credit_bytes"):
        if name in t:
            out[name] = _number(f"tune.{name}", t[name], int, 0, 1 << 62)
    if "chosen" in t:
        c = t["chosen"]
        if not isinstance(c, list) or len(c) != 2:
            raise ValueError("field 'tune.chosen' must be [partition bytes, credit bytes]")
        out["chosen"] = [_number("tune.chosen", v, int, 0, 1 << 62) for v in c]
    return out


def _stacks(threads) -> list:
    if not isinstance(threads, list) or len(threads) > MAX_THREADS:
        raise ValueError(f"field 'stacks' must be a list of at most {MAX_THREADS} threads")
    out = []
    for th in threads:
        if not (isinstance(th, list) and len(th) == 2 and isinstance(th[1], list)
                and len(th[1]) <= MAX_FRAMES):
            raise ValueError("field 'stacks': a thread must be [name, [frames]]")
        frames = []
        for f in th[1]:
            if not (isinstance(f, list) and len(f) == 3):
                raise ValueError("field 'stacks': a frame must be [file, line, function]")
            frames.append([_text("stacks.file", f[0], 160),
                           _number("stacks.line", f[1], int, 0, 1 << 31),
                           _text("stacks.function", f[2], 80)])
        out.append([_text("stacks.thread", th[0], 80), frames])
    return out


_SERVER = {"keys": (int, 0, 1 << 40), "bytes": (int, 0, 1 << 62),
           "rounds": (int, 0, 1 << 62), "open": (int, 0, 1 << 40), "queue": (int, 0, 1 << 40)}


def clean_server(rep) -> dict:
    """A server's heartbeat report (byteps/server/report.py), validated; raises ValueError."""
    if not isinstance(rep, dict):
        raise ValueError("a report must be a map")  # noqa: TRY004
    out = {name: _number(name, rep[name], kind, lo, hi)
           for name, (kind, lo, hi) in _SERVER.items() if name in rep}
    if "replica" in rep:
        out["replica"] = _text("replica", rep["replica"], 80)
    return out


def round_ms(rep: dict) -> float | None:
    """Mean round latency of a report over the servers that completed rounds."""
    vals = [v for v in rep.get("srv_ms", []) if v >= 0]
    return sum(vals) / len(vals) if vals else None


def _median(vals: list[float]) -> float:
    vals = sorted(vals)
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def stragglers(ranks: dict[int, dict], factor: float = 1.5,
               min_ms: float = 10.0) -> dict | None:
    """The slowest rank and why, from ``{rank: {"compute_ms", "push_ms", ...}}``.

    Compute straggler: its own compute time per step (step minus the time blocked waiting
    for communication) exceeds the median of the other ranks by ``factor`` and ``min_ms``
    (in a synchronous job the others then *wait* for it: their wait grows, its does not).
    Network straggler: compute times agree, but its pushes take longer to reach the
    servers (push handed to the socket -> the server's acknowledgement: the upload alone;
    a round's latency would not tell, since in a synchronous job every rank's rounds wait
    for the slowest) by the same margins: its link is slow.  None when no rank stands out
    (or fewer than two ranks report)."""
    for kind, field, what in (("compute", "compute_ms", "of compute per step"),
                              ("network", "push_ms", "per push to reach the servers")):
        vals = {r: v[field] for r, v in ranks.items()
                if isinstance(v.get(field), (int, float)) and v[field] >= 0}
        if len(vals) < 2:
            continue
        r = max(vals, key=vals.get)
        med = _median([v for k, v in vals.items() if k != r])
        if vals[r] > factor * med and vals[r] - med > min_ms:
            slow = "slow to compute" if kind == "compute" else "slow to communicate"
            agree = "" if kind == "compute" else " (compute times agree)"
            return {"rank": r, "kind": kind, "ms": round(vals[r], 1), "median_ms": round(med, 1),
                    "text": f"rank {r} is {slow}: {vals[r]:.1f} ms {what} against a median "
                            f"of {med:.1f} ms on the other ranks{agree}"}
    return None

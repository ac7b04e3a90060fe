"""How a tensor is cut into partitions: the same pure function on every rank.

A synchronous push_pull of a tensor is a pipeline: each rank pushes its partitions, a
partition's server answers once every rank pushed it.  Two stretches of every operation do
not overlap: the *fill* (nothing comes back until some partition has been pushed by every
rank, and its result has been sent to every rank through one server's link: about
2·S·p / bandwidth with S servers and partitions of p bytes) and the *drain* (after the last
push, the last partitions are still to be summed and sent back: about S·p / bandwidth).
With 4 servers, 1 MB partitions at 1 Gbit/s that is ~100 ms of an 800 ms operation.

So a tensor long enough (at least :data:`GRADUATE_MIN` x S partitions) is cut finer at
its two ends: its first 2·S and its last S partitions are a quarter of the size (each rank
starts at a different server's partition, the first S, and goes round, so every rank's
first and last pushes fall there).  The middle keeps the full size, so the number of
messages grows by ~2.25·S per operation.  Measured in docs/scaling.md.  The edges bring
the first results sooner, but results still trail the pushes by one full partition per
server once the middle starts, so autotune's cost model charges that lag for the full
size (``byteps.core.autotune.predict``; docs/speed_log.md, eighteenth pass).
"""
from __future__ import annotations

GRADUATE_MIN = 4       # graduate tensors of at least this many x S full partitions
EDGE_DIVISOR = 4       # edge partitions are this much smaller
EDGE_MIN_ELEMS = 4096  # never cut edges below this many elements


def lengths(n: int, per: int, nservers: int) -> list[int]:
    """Partition lengths (elements) of a tensor of ``n`` elements, full partitions of ``per``."""
    per = max(1, per)
    full = -(-n // per)
    edge = per // EDGE_DIVISOR
    s = max(1, nservers)
    if s < 2 or full < GRADUATE_MIN * s or edge < EDGE_MIN_ELEMS:
        return [min(per, n - i) for i in range(0, n, per)]
    head, tail = 2 * s, s
    mid = n - (head + tail) * edge          # > 0: full >= 4·s partitions of per = 4·edge
    out = [edge] * head
    out += [min(per, mid - i) for i in range(0, mid, per)]
    return out + [edge] * tail


def cut(n: int, per: int, nservers: int, key: int) -> list[tuple[int, int, int, int]]:
    """``(part, start, length, server)`` of each partition; part i on server (key+i) mod S."""
    out, start, s = [], 0, max(1, nservers)
    for i, length in enumerate(lengths(n, per, nservers)):
        out.append((i, start, length, (key + i) % s))
        start += length
    return out

"""A round's reduction in a fixed order: bit-identical sums whatever the arrival order.

Float addition is not associative: summing pushes in arrival order makes two runs of
the same job differ in the last bits once three or more pushes meet (``(a+b)+c`` is
not ``(a+c)+b``).  A synchronous round is therefore reduced along a fixed binary tree
over the pushers' positions (:func:`leaf_positions`): the push of position ``i`` is
leaf ``(0, i)``; node ``(k, i)`` is ``op(node (k-1, 2i), node (k-1, 2i+1))``, or the
one child that exists.  Two siblings are combined as soon as both exist (IEEE add,
min, max and multiply give the same bits whichever arrives first; the left child is
always the first operand), the rest when the round is complete (:func:`collapse`,
level by level in index order, a node without sibling promoted).  The result depends
only on which positions pushed what: ranks that joined simply never arrive.  The
number of element-wise operations is the same as a running sum's (``n - 1``).

Buffers: pushes are read where they arrived.  A push received over a socket is the
server's own copy (:data:`WRITABLE`) and takes partial sums in place; one a worker left
in shared memory is never written.  Otherwise partial sums go into the round's result
buffer (``slot.bufs[round % 2]``) while it is free, else into a per-partition pool of
buffers reused round after round (no allocation in steady state; a 4-pusher round may
need one, 8 pushers up to three).  The last combination writes straight into the
result buffer.

float16 sums are accumulated in float32 and rounded once, into the result buffer
(the original BytePS does the same; Horovod's tests compare three workers' float16 sums
at tolerance 0).
Compressed partitions decompress each push into float32 and combine the same way.
Asynchronous keys (:mod:`byteps.server.staleness`) add each push to the stored value
when it arrives: their order is the arrival order by design.
"""
from __future__ import annotations

import numpy as np

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


def accumulator(dtype: np.dtype, op, compressed: bool) -> np.dtype:
    """The dtype a slot's partial results are kept in: float32 for compressed
    partitions and float16 sums, else the pushed dtype."""
    if compressed or (dtype == F16 and op is np.add):
        return F32
    return dtype


def leaf_positions(workers, local_reduce: str) -> dict[int, int]:
    """``{rank: leaf position}``.  Without local reduction: the rank's index among the
    job's ranks.  With it one rank per host pushes a partition (its local root, or the
    local rank of the slice): the host's index, hosts ordered by their lowest rank."""
    ws = sorted(workers, key=lambda w: w["rank"])
    if local_reduce == "off":
        return {w["rank"]: i for i, w in enumerate(ws)}
    hosts: dict = {}
    for w in ws:
        hosts.setdefault(w["host_id"], len(hosts))
    return {w["rank"]: hosts[w["host_id"]] for w in ws}


class Nodes:
    """The partial results of one round (a synchronous round, store.Round, is one;
    DiLoCo's outer round keeps one, outer.Outer.tree):
    ``nodes`` ``{(level, index): (array, owned)}``: ``owned`` True for the slot's buffers
    (given back when consumed), :data:`WRITABLE` for a received push the server may
    overwrite (a socket frame of its own: partial sums go there, in place), False for a
    push that must stay as it is (a worker's shared memory, a caller's array); ``leaves``: the positions pushed;
    ``result_used``: the result buffer holds a partial result."""
    __slots__ = ("nodes", "leaves", "result_used")

    def __init__(self):
        self.nodes: dict = {}
        self.leaves: set[int] = set()
        self.result_used = False


class Pool:
    """A partition's buffers for partial results (accumulator dtype), reused."""
    __slots__ = ("free", "length", "dtype")

    def __init__(self, length: int, dtype: np.dtype):
        self.free: list = []
        self.length, self.dtype = length, dtype

    def take(self) -> np.ndarray:
        return self.free.pop() if self.free else np.empty(self.length, self.dtype)


def position(t: Nodes, leaf: int | None, rank: int) -> int:
    """The leaf position of ``rank``'s push (``leaf``: its place in
    :func:`leaf_positions`, None: the rank); two pushers on one position (not expected)
    are kept apart, after every regular position."""
    pos = rank if leaf is None else leaf
    return (1 << 20) + rank if pos in t.leaves else pos


def take(t: Nodes, pool: Pool, result) -> np.ndarray:
    if result is not None and not t.result_used and result.dtype == pool.dtype:
        t.result_used = True
        return result
    return pool.take()


#: ``owned`` of a push whose buffer the server may overwrite (not given to the pool)
WRITABLE = 2


def _give(t: Nodes, pool: Pool, result, arr) -> None:
    if arr is result:
        t.result_used = False
    else:
        pool.free.append(arr)


def _combine(t: Nodes, op, pool: Pool, result, lkey, rkey, pkey, out=None) -> None:
    """Replace nodes ``lkey`` (the left operand) and ``rkey`` by their parent ``pkey``."""
    left, lo = t.nodes.pop(lkey)
    right, ro = t.nodes.pop(rkey)
    if out is None:            # in place: the slot's buffer, else a writable push
        owned = True
        if lo is True or (ro is not True and lo):
            out, owned = left, lo
        elif ro:
            out, owned = right, ro
        else:
            out = take(t, pool, result)
    else:
        owned = True
        if out is result:
            t.result_used = True
    if left.dtype == pool.dtype == right.dtype:
        op(left, right, out=out)
    else:                      # float16 in float32: cast in, compute, round once on the way out
        op(left, right, out=out, dtype=pool.dtype, casting="same_kind")
    if lo is True and left is not out:
        _give(t, pool, result, left)
    if ro is True and right is not out:
        _give(t, pool, result, right)
    t.nodes[pkey] = (out, owned)


def add(t: Nodes, pos: int, arr, owned: bool, op, pool: Pool, result,
        cascade: bool = True) -> None:
    """Add the push of leaf position ``pos`` and combine every pair it completes
    (``cascade=False``: the round's last push, :func:`collapse` follows)."""
    t.leaves.add(pos)
    nodes = t.nodes
    nodes[(0, pos)] = (arr, owned)
    k, i = 0, pos
    while cascade and (k, i ^ 1) in nodes:
        _combine(t, op, pool, result, (k, i & ~1), (k, i | 1), (k + 1, i >> 1))
        k, i = k + 1, i >> 1


def collapse(t: Nodes, op, pool: Pool, result):
    """The round is complete: combine what is left level by level in index order (a
    node without sibling is promoted); the last combination writes into ``result``
    (``None``: into an owned operand).  Returns ``(array, owned)`` of the root."""
    nodes = t.nodes
    if len(nodes) == 1:
        (root,) = nodes.values()
        nodes.clear()
        return root
    if len(nodes) == 2:        # two disjoint subtrees: the one of lower positions is left
        (ka, ia), (kb, ib) = nodes
        a, b = ((ka, ia), (kb, ib)) if ia << ka < ib << kb else ((kb, ib), (ka, ia))
        _combine(t, op, pool, result, a, b, None, result)
    k = 0
    while len(nodes) > 1:
        for _, i in sorted(n for n in nodes if n[0] == k):
            if (k, i) not in nodes:
                continue                        # consumed as a right sibling
            if (k, i ^ 1) in nodes:
                last = len(nodes) == 2
                _combine(t, op, pool, result, (k, i), (k, i ^ 1), (k + 1, i >> 1),
                         result if last else None)
            else:
                nodes[(k + 1, i >> 1)] = nodes.pop((k, i))
        k += 1
    (root,) = nodes.values()
    nodes.clear()
    return root


def release(t: Nodes, pool: Pool, result, arr) -> None:
    """Give back an owned buffer no longer needed (the result buffer: mark it free)."""
    _give(t, pool, result, arr)

"""byteps/core/pipeline/partitions.py: every element in exactly one partition, finer edges only for
long tensors, and every rank's first and last pushes (rotated start, api.py) are edge
partitions."""
import pytest

from byteps.core.pipeline.partitions import EDGE_DIVISOR, cut, lengths


@pytest.mark.parametrize("n,per,s", [(25_000_000, 262144, 4), (25_000_000, 1 << 20, 4),
                                     (1000, 100, 4), (262144 * 16 + 5, 262144, 2),
                                     (262144 * 16, 262144, 8), (7, 3, 1), (1, 1, 4)])
def test_cover_exactly(n, per, s):
    parts = cut(n, per, s, key=12345)
    assert [p[0] for p in parts] == list(range(len(parts)))
    assert parts[0][1] == 0 and all(a[1] + a[2] == b[1] for a, b in zip(parts, parts[1:]))
    assert parts[-1][1] + parts[-1][2] == n
    assert all(0 < p[2] <= per for p in parts)
    assert all(p[3] == (12345 + p[0]) % s for p in parts)


def test_short_tensors_are_cut_uniformly():
    assert lengths(262144 * 15, 262144, 4) == [262144] * 15     # < 4 x S full partitions
    assert lengths(262144 * 16, 262144, 1) == [262144] * 16     # one server: nothing to fill
    assert lengths(100 * 1000, 1000, 4) == [1000] * 100         # edges would be too small


def test_edges_are_finer_where_every_rank_starts_and_ends():
    per, s = 1 << 18, 4
    lens = lengths(100 * per, per, s)
    edge = per // EDGE_DIVISOR
    assert lens[:2 * s] == [edge] * (2 * s) and lens[-s:] == [edge] * s
    assert lens[2 * s] == per and sum(lens) == 100 * per
    n = len(lens)
    for first in range(s):               # rank r starts at its (r - key) mod S-th partition
        order = [(first + j) % n for j in range(n)]
        assert all(lens[i] == edge for i in order[:s]), first
        assert all(lens[i] == edge for i in order[-s:]), first

"""The scale model (benchmarks/scale_sim.py) against closed-form bounds.  Fast, no sockets."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from benchmarks.scale_sim import (
    Cpu,
    maxmin_rates,
    partition_sizes,
    ps_bound,
    ring_allreduce,
    simulate_ps,
)

B = 1e9 / 8          # 1 Gbit/s in bytes/s
M = 128e6            # 128 partitions of 1 MB: an equal share on every server count used here


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1024])
def test_ring_is_2_n_minus_1_over_n(n):
    t = ring_allreduce(M, n, B, latency_s=0.0)
    assert t == pytest.approx(2 * (n - 1) / n * M / B, rel=1e-12)


def test_ring_tends_to_2M_over_B_and_latency_adds_per_step():
    assert ring_allreduce(M, 10 ** 6, B, latency_s=0) == pytest.approx(2 * M / B, rel=1e-5)
    assert ring_allreduce(M, 1, B) == 0.0
    extra = ring_allreduce(M, 8, B, latency_s=1e-3) - ring_allreduce(M, 8, B, latency_s=0)
    assert extra == pytest.approx(2 * 7 * 1e-3)


@pytest.mark.parametrize("n,S", [(1, 1), (2, 2), (4, 4), (4, 8), (8, 8), (16, 32)])
def test_ps_with_enough_servers_is_M_over_B(n, S):
    # S >= n servers (same links): the servers' aggregate bandwidth covers the n workers, so
    # each worker moves M each way at its link rate: M/B plus the pipeline's fill and tail
    # (the credit window).  The window must cover every server (credit >= S partitions):
    # otherwise all workers crowd the same few servers (test_incast_...)
    # The S connections of a worker share its link, so their partitions complete in rounds
    # of S: the tail is one round, S partitions.
    part, credit = 1e6, max(4, S)
    r = simulate_ps(M, n, S, B, part=part, credit=credit, latency_s=0.0)
    assert r.time_s >= M / B * (1 - 1e-9)
    assert r.time_s <= (M + credit * part) / B * 1.0001
    assert simulate_ps(M, n, S, B, part=part / 8, credit=8 * credit,
                       latency_s=0.0).time_s <= (M + credit * part / 8) / B * 1.0001
    assert r.link_time_s == pytest.approx(M / B)
    assert ps_bound(M, n, S, B) == pytest.approx(M / B)


def test_ps_bound_is_server_bound_with_few_servers():
    n, S = 8, 2
    r = simulate_ps(M, n, S, B, part=1e6, credit=8, latency_s=0.0)
    bound = n * M / (S * B)
    assert ps_bound(M, n, S, B) == pytest.approx(bound)
    assert bound * (1 - 1e-9) <= r.time_s <= bound * 1.1


def test_ps_tail_is_the_credit_window():
    # same order on every worker, fair links: the last window's pulls start only after its
    # pushes: one op ~ (M + window) / B (docs/cluster.md, "the credit window's tail")
    for part in (1e6, 4e6):
        r = simulate_ps(M, 2, 2, B, part=part, credit=4, latency_s=0.0)
        assert M / B < r.time_s <= (M + 4 * part) / B * 1.001
    small = simulate_ps(M, 4, 4, B, part=0.5e6, credit=4, latency_s=0.0).time_s
    big = simulate_ps(M, 4, 4, B, part=4e6, credit=4, latency_s=0.0).time_s
    assert small < big


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_more_servers_never_slower(n):
    # Up to S = n (the point where the servers' aggregate bandwidth equals the workers'), each
    # added server shortens the op; beyond it the op stays at M/B except for the pipeline's
    # tail (a worker's S connections complete their partitions in rounds of S: at most S * part
    # more).  The closed-form bound never grows with S.
    part = 1e6
    for cpu in (Cpu(), Cpu(a_w=1e-4, b_w=1e-9, a_s=1e-4, b_s=1e-9)):
        prev = math.inf
        for S in (1, 2, 4, 8, 16):
            t = simulate_ps(M, n, S, B, part=part, credit=16, latency_s=20e-6, cpu=cpu).time_s
            if S <= n:
                assert t <= prev * (1 + 1e-9), (n, S, t, prev)
            else:
                assert t <= prev + S * part / B, (n, S, t, prev)
            prev = t
        bounds = [ps_bound(M, n, S, B) for S in range(1, 40)]
        assert all(b2 <= b1 for b1, b2 in itertools.pairwise(bounds))


@pytest.mark.parametrize("r", [0.5, 0.25, 1 / 32])
def test_compression_ratio_scales_the_byte_term(r):
    cpu = Cpu(a_w=0.0, b_w=2e-9, a_s=0.0, b_s=3e-9)
    full = simulate_ps(M, 4, 4, B, part=1e6, credit=4, latency_s=0.0, cpu=cpu).time_s
    comp = simulate_ps(M, 4, 4, B, part=1e6, credit=4, latency_s=0.0, cpu=cpu, ratio=r).time_s
    assert comp == pytest.approx(r * full, rel=1e-6)
    assert ring_allreduce(M, 8, B, latency_s=0, ratio=r) == pytest.approx(
        r * ring_allreduce(M, 8, B, latency_s=0))
    assert ps_bound(M, 8, 4, B, ratio=r) == pytest.approx(r * ps_bound(M, 8, 4, B))


def test_per_message_cost_adds_up():
    # CPU-bound: one worker, one server, links far faster than the CPU: every partition costs
    # the worker a_w and the server a_s (pipelined: the slower stage dominates)
    cpu = Cpu(a_w=1e-3, a_s=1e-4)
    r = simulate_ps(M, 1, 1, 1e15, part=1e6, credit=4, latency_s=0.0, cpu=cpu)
    assert r.time_s == pytest.approx(M / 1e6 * 1e-3, rel=0.02)
    slow = simulate_ps(M, 1, 1, 1e15, part=1e6, credit=4, latency_s=0.0, cpu=cpu.scaled(0.5))
    assert slow.time_s == pytest.approx(2 * r.time_s, rel=1e-6)


def test_colocated_carries_the_ring_bytes():
    for n in (2, 4, 8):
        r = simulate_ps(M, n, n, B, part=1e6, credit=max(4, n), latency_s=0.0, colocated=True)
        bound = 2 * (n - 1) / n * M / B
        assert r.link_time_s == pytest.approx(bound)
        assert bound * (1 - 1e-9) <= r.time_s <= bound * 1.05


def test_incast_with_a_window_smaller_than_the_servers():
    # every worker pushes the same partitions at the same time: with a 4-partition window only
    # 4 servers are busy, each shared by all n workers -> per-worker rate 4 B / n
    n = S = 32
    t = simulate_ps(M, n, S, B, part=1e6, credit=4, latency_s=0.0).time_s
    assert t == pytest.approx(M / (4 * B / n), rel=0.1)
    t_big = simulate_ps(M, n, S, B, part=1e6, credit=S, latency_s=0.0).time_s
    assert t_big <= (M + S * 1e6) / B * 1.001
    assert t_big < t / 5


def test_maxmin_and_partitions():
    # two flows share link 0; flow 1 also limited by link 1
    rates = maxmin_rates(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([10.0, 2.0]))
    assert rates == pytest.approx([8.0, 2.0])
    # a coefficient counts that many identical flows
    rates = maxmin_rates(np.array([[4.0]]), np.array([8.0]))
    assert rates == pytest.approx([2.0])
    assert partition_sizes(10, 4) == [4, 4, 2]
    assert partition_sizes(3, 4) == [3]
    with pytest.raises(ValueError):
        simulate_ps(M, 2, 3, B, colocated=True)

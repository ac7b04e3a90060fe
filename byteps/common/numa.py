"""NUMA nodes from sysfs and binding of worker processes to their node's cores.

``bpslaunch`` binds local rank ``r`` of ``L`` to NUMA node ``r * N // L`` (or
to the node of its GPU when the topology names one) when ``BYTEPS_NUMA_ON``
is 1, which is the default where the machine has more than one node.  Pages
of the shared buffers are placed by first touch, so each buffer lands on the
node of the process that writes it first (its owner).
"""
from __future__ import annotations

import os


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the sysfs cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                cpus.extend(range(int(lo), int(hi) + 1))
            else:
                cpus.append(int(lo))
        except ValueError:
            raise ValueError(f"malformed CPU list {text!r} (expected e.g. 0-3,8-11)") from None
    return cpus


def numa_nodes(sysfs: str = "/sys") -> dict[int, list[int]]:
    """NUMA node id -> its CPUs (empty dict where sysfs has no node directory)."""
    base = os.path.join(sysfs, "devices", "system", "node")
    nodes: dict[int, list[int]] = {}
    try:
        names = os.listdir(base)
    except OSError:
        return nodes
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                with open(os.path.join(base, name, "cpulist")) as f:
                    cpus = parse_cpulist(f.read())
            except OSError:
                continue
            if cpus:                       # memory-only nodes (CXL, HBM) have no CPUs
                nodes[int(name[4:])] = cpus
    return dict(sorted(nodes.items()))


def numa_enabled(setting: bool | None, nodes: dict[int, list[int]]) -> bool:
    """BYTEPS_NUMA_ON, defaulting to 'more than one node with CPUs'."""
    return len(nodes) > 1 if setting is None else setting


def node_of_local_rank(local_rank: int, local_size: int, nodes: dict[int, list[int]],
                       gpu_nodes: list[int] | None = None) -> int | None:
    """The NUMA node of a local rank: its GPU's node if known, else a contiguous block."""
    if not nodes:
        return None
    if gpu_nodes and local_rank < len(gpu_nodes) and gpu_nodes[local_rank] in nodes:
        return gpu_nodes[local_rank]
    ids = list(nodes)
    return ids[local_rank * len(ids) // max(1, local_size)]


def worker_cpus(local_rank: int, local_size: int, setting: bool | None = None,
                sysfs: str = "/sys", gpu_nodes: list[int] | None = None) -> list[int] | None:
    """CPUs a local rank should be bound to, or None when binding is off/impossible."""
    nodes = numa_nodes(sysfs)
    if not numa_enabled(setting, nodes):
        return None
    node = node_of_local_rank(local_rank, local_size, nodes, gpu_nodes)
    return None if node is None else nodes[node]


def bind(cpus: list[int] | None) -> list[int] | None:
    """Restrict this process to ``cpus`` (within what it may use now); returns the set used."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    use = sorted(set(cpus) & allowed) or sorted(allowed)
    os.sched_setaffinity(0, use)
    return use

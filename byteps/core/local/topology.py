"""Topology of a worker host: GPUs, PCIe switches, NICs and NUMA nodes.

Sources, in order of trust:

* sysfs — ``/sys/bus/pci/devices/<bdf>`` links into the device tree
  (``/sys/devices/pci0000:00/<root port>/<switch up>/<switch down>/<bdf>``)
  plus ``class``, ``vendor`` and ``numa_node`` of each device, and
  ``/sys/devices/system/node/node<N>/cpulist``.  Two GPUs are in one PCIe
  switch group when they sit below the same switch upstream port of the same
  root port (nvidia-smi's PIX or PXB).
* ``nvidia-smi topo -m`` (when the tool exists) — the link matrix (``X``,
  ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ``NV#``) and each GPU's CPU/NUMA
  affinity.  NVLink pairs hide their PCIe relation, so switch groups are the
  connected components of PIX/PXB links over *all* devices (two GPUs that are
  each PIX to one NIC share that NIC's switch).
* ``BYTEPS_PCIE_SWITCH_SIZE`` overrides both: consecutive local ranks in
  groups of that size.

:func:`reduce_groups` turns this into the groups of local ranks that reduce
together first (switch groups, else NUMA nodes), before the CPU sums across
groups.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess

from byteps.common.numa import node_of_local_rank, numa_enabled, numa_nodes, parse_cpulist

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")          # VGA / 3D controller (class code prefix)
NIC_CLASSES = ("0x0200", "0x0207")          # Ethernet / InfiniBand
LINKS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TopologyError(ValueError):
    """A topology source could not be parsed."""


@dataclasses.dataclass
class PciDevice:
    bdf: str
    kind: str                   # "gpu" | "nic"
    host_bridge: str            # "pci0000:00"
    bridges: list[str]          # root port first, the device's parent last
    numa: int | None


@dataclasses.dataclass
class Topology:
    """What the local reduction needs to know about a host."""
    gpus: list[str]                                  # bus ids (sysfs) or names (nvidia-smi)
    switch_groups: list[list[int]]                   # GPU indices per PCIe switch group
    gpu_numa: list[int | None]
    numa: dict[int, list[int]]                       # node -> CPUs
    nvlink: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    gpu_cpus: list[list[int]] = dataclasses.field(default_factory=list)
    source: str = ""


# ------------------------------------------------------------------ sysfs
def pci_devices(sysfs: str = "/sys") -> list[PciDevice]:
    """NVIDIA GPUs and network adapters found under ``<sysfs>/bus/pci/devices``, by bus id."""
    base = os.path.join(sysfs, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for bdf in names:
        path = os.path.join(base, bdf)
        cls, vendor = _read(path, "class"), _read(path, "vendor")
        if cls is None:
            continue
        if vendor == NVIDIA and cls.startswith(GPU_CLASSES):
            kind = "gpu"
        elif cls.startswith(NIC_CLASSES):
            kind = "nic"
        else:
            continue
        real = os.path.realpath(path).split(os.sep)
        roots = [i for i, c in enumerate(real) if c.startswith("pci") and ":" in c]
        if not roots:
            raise TopologyError(f"{path} does not link into a pciDDDD:BB device tree")
        chain = real[roots[-1]:]
        bridges = [c for c in chain[1:-1] if _BDF.match(c)]
        numa = _read(path, "numa_node")
        node = int(numa) if numa is not None and numa.lstrip("-").isdigit() else None
        out.append(PciDevice(bdf, kind, chain[0], bridges,
                             node if node is not None and node >= 0 else None))
    return out


def _read(path: str, name: str) -> str | None:
    try:
        with open(os.path.join(path, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def pcie_link(a: PciDevice, b: PciDevice) -> str:
    """nvidia-smi's name for the PCIe path between two devices."""
    if a.bdf == b.bdf:
        return "X"
    if a.host_bridge != b.host_bridge:
        return "NODE" if a.numa is not None and a.numa == b.numa else "SYS"
    common = 0
    for x, y in zip(a.bridges, b.bridges):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    return "PIX" if max(len(a.bridges), len(b.bridges)) - common <= 1 else "PXB"


def from_sysfs(sysfs: str = "/sys") -> Topology:
    """The topology of this machine (or of a recorded tree rooted at ``sysfs``)."""
    devs = pci_devices(sysfs)
    gpus = [d for d in devs if d.kind == "gpu"]
    groups: list[list[int]] = []
    key_of: dict[tuple, int] = {}
    for i, g in enumerate(gpus):
        # below a switch: root port + switch upstream port; directly on a root port: alone
        key = (g.host_bridge, *g.bridges[:2]) if len(g.bridges) >= 3 else ("alone", g.bdf)
        if key not in key_of:
            key_of[key] = len(groups)
            groups.append([])
        groups[key_of[key]].append(i)
    return Topology(gpus=[g.bdf for g in gpus], switch_groups=groups,
                    gpu_numa=[g.numa for g in gpus], numa=numa_nodes(sysfs), source="sysfs")


# ------------------------------------------------------------------ nvidia-smi
def parse_nvidia_smi_topo(text: str) -> Topology:
    """Parse the output of ``nvidia-smi topo -m`` (old and new column layouts)."""
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    head = next((i for i, ln in enumerate(lines) if re.search(r"\tGPU\d+", ln)), None)
    if head is None:
        raise TopologyError("no 'GPU0 GPU1 ...' header line in the nvidia-smi topo -m output")
    cols = [c.strip() for c in lines[head].split("\t")[1:]]
    devs = [c for c in cols if c and " " not in c and not c.endswith("Affinity")]
    extra = cols[len(devs):]
    rows: dict[str, list[str]] = {}
    for ln in lines[head + 1:]:
        if not ln.strip() or ln.strip().startswith("Legend"):
            break
        cells = [c.strip() for c in ln.split("\t")]
        name, vals = cells[0], cells[1:]
        if name not in devs:
            raise TopologyError(f"row {name!r} is not one of the columns {devs}")
        if len(vals) < len(devs):
            raise TopologyError(f"row {name!r} has {len(vals)} cells, expected {len(devs)}+")
        for v in vals[:len(devs)]:
            if v not in LINKS and not re.fullmatch(r"NV\d+", v):
                raise TopologyError(f"row {name!r}: unknown link type {v!r}")
        rows[name] = vals
    gpus = [d for d in devs if re.fullmatch(r"GPU\d+", d)]
    if not gpus or any(g not in rows for g in gpus):
        raise TopologyError("the nvidia-smi topo -m matrix lacks GPU rows")
    # PIX/PXB components over every device, then restricted to GPUs
    parent = {d: d for d in devs}

    def find(d):
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d
    nvlink = {}
    for a in rows:
        for j, b in enumerate(devs):
            v = rows[a][j]
            if v in ("PIX", "PXB"):
                parent[find(a)] = find(b)
            elif v.startswith("NV") and a in gpus and b in gpus:
                i1, i2 = sorted((gpus.index(a), gpus.index(b)))
                nvlink[(i1, i2)] = int(v[2:])
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(gpus):
        groups.setdefault(find(g), []).append(i)
    cpu_col = extra.index("CPU Affinity") if "CPU Affinity" in extra else None
    numa_col = extra.index("NUMA Affinity") if "NUMA Affinity" in extra else None
    gpu_cpus, gpu_numa = [], []
    for g in gpus:
        ex = rows[g][len(devs):] + [""] * len(extra)
        cpus = parse_cpulist(ex[cpu_col]) if cpu_col is not None and ex[cpu_col] else []
        gpu_cpus.append(cpus)
        nv = ex[numa_col] if numa_col is not None else ""
        gpu_numa.append(int(nv) if nv.isdigit() else None)
    numa: dict[int, list[int]] = {}
    if all(n is None for n in gpu_numa):           # old layout: nodes from distinct affinities
        seen: list[tuple] = []
        for cpus in gpu_cpus:
            t = tuple(cpus)
            if t and t not in seen:
                seen.append(t)
        gpu_numa = [seen.index(tuple(c)) if c else None for c in gpu_cpus]
        numa = {i: list(t) for i, t in enumerate(seen)}
    else:
        for n, cpus in zip(gpu_numa, gpu_cpus):
            if n is not None:
                numa.setdefault(n, cpus)
    return Topology(gpus=gpus, switch_groups=sorted(groups.values()), gpu_numa=gpu_numa,
                    numa=numa, nvlink=nvlink, gpu_cpus=gpu_cpus, source="nvidia-smi")


def detect(sysfs: str = "/sys", nvidia_smi: str | None = None) -> Topology:
    """This machine's topology: sysfs, refined by ``nvidia-smi topo -m`` when it exists."""
    topo = from_sysfs(sysfs)
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return topo
    try:
        res = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=15,
                             check=False)
        smi = parse_nvidia_smi_topo(res.stdout) if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, TopologyError):
        smi = None
    if smi is None:
        return topo
    if len(smi.gpus) != len(topo.gpus):          # e.g. containers hide the sysfs tree
        smi.numa = topo.numa or smi.numa
        return smi
    topo.nvlink, topo.gpu_cpus, topo.source = smi.nvlink, smi.gpu_cpus, "sysfs+nvidia-smi"
    return topo


# ------------------------------------------------------------------ groups
def reduce_groups(local_size: int, switch_size: int | None = None,
                  topo: Topology | None = None, numa_on: bool | None = None) -> list[list[int]]:
    """Groups of local ranks that reduce together before the CPU sums across groups.

    ``BYTEPS_PCIE_SWITCH_SIZE`` wins; else the PCIe switch groups of the GPUs
    (local rank i uses GPU i) when some group has more than one GPU; else the
    NUMA nodes of the ranks when NUMA binding is on; else one group.
    """
    ranks = list(range(local_size))
    if switch_size:
        return [ranks[i:i + switch_size] for i in range(0, local_size, switch_size)]
    if topo is not None and len(topo.gpus) >= local_size > 1:
        sw = [[i for i in g if i < local_size] for g in topo.switch_groups]
        sw = [g for g in sw if g]
        if any(len(g) > 1 for g in sw):
            return sorted(sw)
    nodes = topo.numa if topo is not None and topo.numa else {}
    if local_size > 1 and numa_enabled(numa_on, nodes):
        gpu_nodes = topo.gpu_numa if topo is not None and len(topo.gpus) >= local_size else None
        by: dict = {}
        for r in ranks:
            by.setdefault(node_of_local_rank(r, local_size, nodes, gpu_nodes), []).append(r)
        return sorted(by.values())
    return [ranks]

"""Topology detection against recorded sysfs trees and `nvidia-smi topo -m` outputs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from byteps.common import numa
from byteps.core.local import topology
from byteps.core.local.topology import (
    TopologyError,
    from_sysfs,
    parse_nvidia_smi_topo,
    pci_devices,
    pcie_link,
    reduce_groups,
)

FIX = Path(__file__).resolve().parent / "fixtures" / "topology"


def materialize(record: Path, dest: Path) -> Path:
    """Rebuild a sysfs tree (links + files) from a local_record_sysfs.py record."""
    for line in record.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, path, value = (line.split(" ", 2) + [""])[:3]
        p = dest / path
        p.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            os.symlink(value, p)
        elif kind == "file":
            p.write_text(value + "\n")
        else:
            raise ValueError(f"bad record line {line!r}")
    return dest


@pytest.fixture
def dgx1(tmp_path):
    return materialize(FIX / "dgx1" / "sysfs.txt", tmp_path / "dgx1")


@pytest.fixture
def epyc(tmp_path):
    return materialize(FIX / "epyc-1s-4gpu" / "sysfs.txt", tmp_path / "epyc")


def test_dgx1_sysfs(dgx1):
    t = from_sysfs(str(dgx1))
    assert t.gpus == ["0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0",
                      "0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"]
    assert t.switch_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert t.gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.numa == {0: list(range(20)) + list(range(40, 60)),
                      1: list(range(20, 40)) + list(range(60, 80))}
    devs = {d.bdf: d for d in pci_devices(str(dgx1))}
    # the BMC's ASPEED VGA is not a GPU; the X540 and the four IB adapters are NICs
    assert "0000:0e:00.0" not in devs
    assert sorted(b for b, d in devs.items() if d.kind == "nic") == [
        "0000:01:00.0", "0000:01:00.1", "0000:05:00.0", "0000:0c:00.0", "0000:84:00.0",
        "0000:8b:00.0"]
    link = lambda a, b: pcie_link(devs[a], devs[b])
    assert link("0000:06:00.0", "0000:07:00.0") == "PIX"
    assert link("0000:06:00.0", "0000:05:00.0") == "PIX"
    assert link("0000:06:00.0", "0000:0a:00.0") == "PHB"
    assert link("0000:06:00.0", "0000:85:00.0") == "SYS"
    assert link("0000:06:00.0", "0000:06:00.0") == "X"


def test_dgx1_nvidia_smi_matches_sysfs(dgx1):
    smi = parse_nvidia_smi_topo((FIX / "dgx1" / "nvidia-smi-topo-m.txt").read_text())
    sysfs = from_sysfs(str(dgx1))
    assert smi.gpus == [f"GPU{i}" for i in range(8)]
    # NVLink hides the PCIe relation of GPU0/GPU1; their shared PIX NIC reveals the switch
    assert smi.switch_groups == sysfs.switch_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert smi.gpu_numa == sysfs.gpu_numa
    assert smi.numa == sysfs.numa
    assert smi.nvlink[(0, 1)] == 1 and smi.nvlink[(0, 3)] == 2 and (0, 5) not in smi.nvlink
    assert sum(smi.nvlink.values()) == 8 * 6 // 2           # six links per V100
    assert smi.gpu_cpus[5] == list(range(20, 40)) + list(range(60, 80))


def test_single_socket(epyc):
    t = from_sysfs(str(epyc))
    assert t.gpus == ["0000:01:00.0", "0000:21:00.0", "0000:43:00.0", "0000:44:00.0"]
    assert t.switch_groups == [[0], [1], [2, 3]]        # audio functions are not GPUs
    assert t.numa == {0: list(range(32))} and t.gpu_numa == [0, 0, 0, 0]
    devs = {d.bdf: d for d in pci_devices(str(epyc))}
    assert pcie_link(devs["0000:01:00.0"], devs["0000:21:00.0"]) == "NODE"
    assert pcie_link(devs["0000:43:00.0"], devs["0000:44:00.0"]) == "PIX"
    smi = parse_nvidia_smi_topo((FIX / "epyc-1s-4gpu" / "nvidia-smi-topo-m.txt").read_text())
    assert smi.switch_groups == t.switch_groups
    assert smi.gpu_numa == [0, 0, 0, 0] and smi.numa == {0: list(range(32))}
    assert smi.nvlink == {}


def test_reduce_groups(dgx1, epyc):
    d, e = from_sysfs(str(dgx1)), from_sysfs(str(epyc))
    assert reduce_groups(8, topo=d) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert reduce_groups(4, topo=d) == [[0, 1], [2, 3]]
    assert reduce_groups(4, topo=e) == [[0], [1], [2, 3]]
    assert reduce_groups(8, switch_size=4, topo=d) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert reduce_groups(3, switch_size=2) == [[0, 1], [2]]
    # CPU-only workers on the two-socket machine: NUMA nodes (on by default with 2 nodes)
    cpu_only = topology.Topology(gpus=[], switch_groups=[], gpu_numa=[], numa=d.numa)
    assert reduce_groups(4, topo=cpu_only) == [[0, 1], [2, 3]]
    assert reduce_groups(4, topo=cpu_only, numa_on=False) == [[0, 1, 2, 3]]
    one_node = topology.Topology(gpus=[], switch_groups=[], gpu_numa=[], numa=e.numa)
    assert reduce_groups(3, topo=one_node) == [[0, 1, 2]]


def test_numa_binding_plan(dgx1, epyc):
    assert numa.worker_cpus(0, 8, sysfs=str(dgx1)) == d0() and \
        numa.worker_cpus(7, 8, sysfs=str(dgx1)) == d1()
    assert numa.worker_cpus(3, 8, sysfs=str(dgx1), gpu_nodes=[1] * 8) == d1()
    assert numa.worker_cpus(0, 4, sysfs=str(epyc)) is None            # one node: off
    assert numa.worker_cpus(0, 4, setting=True, sysfs=str(epyc)) == list(range(32))
    assert numa.worker_cpus(0, 8, setting=False, sysfs=str(dgx1)) is None
    assert numa.parse_cpulist("0-2,8,10-11\n") == [0, 1, 2, 8, 10, 11]
    with pytest.raises(ValueError, match="malformed CPU list"):
        numa.parse_cpulist("0-x")


def d0():
    return list(range(20)) + list(range(40, 60))


def d1():
    return list(range(20, 40)) + list(range(60, 80))


def test_ci_vm_record_and_live_sysfs(tmp_path):
    """The real recording of this CI machine parses; so does the live /sys."""
    t = from_sysfs(str(materialize(FIX / "ci-vm" / "sysfs.txt", tmp_path / "sys")))
    assert t.gpus == [] and len(t.numa) >= 1
    live = topology.detect()
    assert isinstance(live.switch_groups, list) and all(live.numa.values())


def test_bad_nvidia_smi_output():
    with pytest.raises(TopologyError, match="no 'GPU0 GPU1"):
        parse_nvidia_smi_topo("No devices were found\n")
    bad = (FIX / "dgx1" / "nvidia-smi-topo-m.txt").read_text().replace("NV1", "QQ1", 1)
    with pytest.raises(TopologyError, match="unknown link type 'QQ1'"):
        parse_nvidia_smi_topo(bad)


def test_launcher_binds_child_to_cpus():
    """bpslaunch's child set-up pins a worker to the CPUs of its NUMA node."""
    from byteps.launcher import _child_setup
    cpu = max(os.sched_getaffinity(0))
    probe = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=False, preexec_fn=_child_setup([cpu]))
    assert out.returncode == 0 and out.stdout.strip() == f"[{cpu}]", out

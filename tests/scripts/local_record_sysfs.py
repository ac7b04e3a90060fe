"""Record the topology-relevant part of a machine's sysfs into a text fixture.

    python tests/scripts/local_record_sysfs.py [/sys] > tests/fixtures/topology/<machine>/sysfs.txt
    nvidia-smi topo -m > tests/fixtures/topology/<machine>/nvidia-smi-topo-m.txt

Lines are ``link <path> <target>`` (the /sys/bus/pci/devices symlinks into the
device tree) and ``file <path> <content>`` (class, vendor, device, numa_node,
local_cpulist of each PCI device; cpulist of each NUMA node), paths relative
to the sysfs root.  tests/test_topology.py rebuilds the tree from these lines.
"""
from __future__ import annotations

import os
import sys

DEV_FILES = ("class", "vendor", "device", "numa_node", "local_cpulist")


def record(sysfs: str = "/sys") -> list[str]:
    lines = []
    pci = os.path.join(sysfs, "bus", "pci", "devices")
    for name in sorted(os.listdir(pci)) if os.path.isdir(pci) else []:
        link = os.path.join(pci, name)
        target = os.readlink(link)
        lines.append(f"link bus/pci/devices/{name} {target}")
        real = os.path.relpath(os.path.realpath(link), os.path.realpath(sysfs))
        for f in DEV_FILES:
            try:
                with open(os.path.join(link, f)) as fh:
                    lines.append(f"file {real}/{f} {fh.read().strip()}")
            except OSError:
                pass
    node = os.path.join(sysfs, "devices", "system", "node")
    for name in sorted(os.listdir(node)) if os.path.isdir(node) else []:
        p = os.path.join(node, name, "cpulist")
        if name.startswith("node") and os.path.exists(p):
            with open(p) as fh:
                lines.append(f"file devices/system/node/{name}/cpulist {fh.read().strip()}")
    for f in ("online", "possible"):
        p = os.path.join(node, f)
        if os.path.exists(p):
            with open(p) as fh:
                lines.append(f"file devices/system/node/{f} {fh.read().strip()}")
    return lines


if __name__ == "__main__":
    print("# byteps sysfs topology record v1 (tests/scripts/local_record_sysfs.py)")
    print("\n".join(record(sys.argv[1] if len(sys.argv) > 1 else "/sys")))

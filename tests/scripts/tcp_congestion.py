"""Worker script (numpy) for tests/test_tcp_congestion.py.

    tcp_congestion.py OUT_DIR SERVER_PORT

Pushes and pulls a 4 MB tensor over TCP, then lists (with iproute2's ``ss``, not byteps's
own code) the congestion control of every established connection to or from the server's
port.  Writes OUT_DIR/rank<r>.json.
"""
import json
import subprocess
import sys

import numpy as np

import byteps.numpy as bps

out_dir, port = sys.argv[1], sys.argv[2]
bps.init()
x = np.full(1 << 20, bps.rank() + 1.0, dtype=np.float32)
for _ in range(3):
    y = bps.push_pull(x, name="t", average=False)
assert float(y[0]) == sum(range(1, bps.size() + 1)), y[:4]
bps.barrier()        # every worker's connections are up and have carried data
ss = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                    timeout=30, check=True).stdout
# ss -i: one line with the addresses, the next (indented) with the connection's details,
# the congestion control's name among them (after options such as "ts sack")
known = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
lines = ss.splitlines()
found = []
for head, info in zip(lines, lines[1:]):
    if head[:1].isspace() or not info[:1].isspace():
        continue
    addrs = head.split()[-2:]
    if any(a.rsplit(":", 1)[-1] == port for a in addrs):
        cc = [t for t in info.split() if t in known]
        found.append([addrs[0], addrs[1], cc[0] if cc else "?"])
with open(f"{out_dir}/rank{bps.rank()}.json", "w") as f:
    json.dump({"conns": found}, f)
bps.shutdown()

"""Every 1 s: TCP retransmission counters of every bpsc-* namespace; print the last seen."""
import subprocess, sys, time, signal, json
last = {}
stop = False
def h(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, h)
def read(ns):
    snmp = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat"],
                          capture_output=True, text=True, timeout=5).stdout.splitlines()
    out = {}
    for a, b in zip(snmp[::2], snmp[1::2]):
        ka, kb = a.split(), b.split()
        if ka[0] in ("Tcp:", "TcpExt:") and ka[0] == kb[0]:
            d = dict(zip(ka[1:], kb[1:]))
            for k in ("RetransSegs", "OutSegs", "TCPTimeouts", "TCPLossProbes", "TCPSpuriousRTOs",
                      "TCPFastRetrans", "TCPSlowStartRetrans", "TCPRcvQDrop", "TCPBacklogDrop", "TCPZeroWindowDrop", "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv"):
                if k in d:
                    out[k] = int(d[k])
    return out
while not stop:
    try:
        nss = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines() if l.startswith("bpsc-")]
        for ns in nss:
            try:
                last[ns] = read(ns)
            except Exception:
                pass
    except Exception:
        pass
    if last:
        t = {}
        for d in last.values():
            for k, v in d.items():
                t[k] = t.get(k, 0) + v
        print(time.strftime('%H:%M:%S'), t, flush=True)
    time.sleep(1)
tot = {}
for ns, d in sorted(last.items()):
    print(ns, d)
    for k, v in d.items():
        tot[k] = tot.get(k, 0) + v
print("TOTAL", tot)

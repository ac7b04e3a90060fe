"""Sample per-thread CPU and context switches of byteps/mesh processes until they exit.
Usage: threads.py OUT.json  (runs until killed or 600 s); one line per thread at the end."""
import json, os, sys, time, collections, signal
out = sys.argv[1]
tick = os.sysconf("SC_CLK_TCK")
last = {}   # (pid, tid) -> (role, pname, tname, utime, stime, vcs, nvcs)
def role(pid):
    try:
        if os.readlink(f"/proc/{pid}/ns/net") == MYNS:
            return None
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    d = dict(x.split(b"=", 1) for x in env if b"=" in x)
    r = d.get(b"DMLC_ROLE")
    launcher = b"byteps.launcher" in cmd
    if r:
        if launcher and any(c.endswith(b".py") for c in cmd):
            return r.decode() + "-launcher"
        return r.decode()
    if d.get(b"RANK") is not None and any(c.endswith(b".py") for c in cmd):
        return "gloo"
    return None
MYNS = os.readlink('/proc/self/ns/net')
stop = False
def h(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, h)
t_end = time.time() + 600
cpu0 = open('/proc/stat').readline().split()[1:]
snaps = []
while not stop and time.time() < t_end:
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        r = role(p)
        if r is None:
            continue
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                st = open(f"/proc/{p}/task/{t}/stat").read()
                name = st[st.index("(") + 1:st.rindex(")")]
                f = st[st.rindex(")") + 2:].split()
                s = open(f"/proc/{p}/task/{t}/status").read()
                vcs = int(s.split("voluntary_ctxt_switches:")[1].split()[0])
                nvcs = int(s.split("nonvoluntary_ctxt_switches:")[1].split()[0])
                last[(p, t)] = (r, name, int(f[11]) / tick, int(f[12]) / tick, vcs, nvcs)
        except (OSError, IndexError):
            continue
    time.sleep(0.5)
    snaps.append((time.time(), open('/proc/stat').readline().split()[1:]))
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0])
for (p, t), (r, name, u, s, v, n) in last.items():
    a = agg[(r, name)]; a[0] += 1; a[1] += u; a[2] += s; a[3] += v; a[4] += n
rows = [dict(role=r, thread=n, count=a[0], user_s=round(a[1], 2), sys_s=round(a[2], 2), vcs=a[3], nvcs=a[4]) for (r, n), a in sorted(agg.items())]
cpu1 = open('/proc/stat').readline().split()[1:]
d = [int(b) - int(a) for a, b in zip(cpu0, cpu1)]
names = 'user nice system idle iowait irq softirq steal'.split()
share = {n: round(v / sum(d), 3) for n, v in zip(names, d)}
print('whole-machine CPU shares over the sampling:', share)
# per-second idle share series
ser = []
for (ta, a), (tb, b) in zip(snaps, snaps[1:]):
    dd = [int(y) - int(x) for x, y in zip(a, b)]
    ser.append(round(dd[3] / max(1, sum(dd)), 2))
print('idle share per 0.5 s:', ser)
rows.append({'machine': share, 'idle_series': ser})
json.dump(rows, open(out, "w"), indent=0)
for x in rows:
    print(x)

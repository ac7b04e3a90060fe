import json, sys, collections
d = sys.argv[1]; step = int(sys.argv[2]); n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
ranks = {}
for r in range(4):
    evs = json.load(open(f"{d}/{r}/comm.json"))["traceEvents"]
    ranks[r] = evs
t0 = min(e["ts"] for r in ranks for e in ranks[r] if e.get("cat") == "tensor" and e["args"].get("step") == step)
rows = collections.defaultdict(dict)
for r, evs in ranks.items():
    for e in evs:
        if e.get("cat") == "partition" and e["args"]["step"] == step:
            p = e["args"]["part"]
            rows[p].setdefault("srv", e["args"]["server"]); rows[p].setdefault("kb", e["args"]["bytes"] // 1024)
            if e["name"] == "push":
                rows[p][f"s{r}"] = (e["ts"] - t0) / 1e3; rows[p][f"a{r}"] = (e["ts"] + e["dur"] - t0) / 1e3
            if e["name"] == "server+pull":
                rows[p][f"r{r}"] = (e["ts"] + e["dur"] - t0) / 1e3
    for e in evs:
        if e.get("cat") == "tensor" and e["args"].get("step") == step:
            print(f"rank {r} op start {(e['ts'] - t0) / 1e3:.1f} end {(e['ts'] + e['dur'] - t0) / 1e3:.1f}")
print("part srv KB | sent r0..r3 | acked r0..r3 | result r0..r3")
for p in sorted(rows)[:n] + sorted(rows)[-8:]:
    x = rows[p]
    f = lambda k: " ".join(f"{x.get(k + str(r), float('nan')):6.0f}" for r in range(4))
    print(f"{p:4d} {x['srv']:3d} {x['kb']:5d} | {f('s')} | {f('a')} | {f('r')}")

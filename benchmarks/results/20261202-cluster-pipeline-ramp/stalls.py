import json, sys, collections
d = sys.argv[1]
for r in range(4):
    evs = json.load(open(f"{d}/{r}/comm.json"))["traceEvents"]
    by = collections.defaultdict(list)
    starts = {e["args"]["step"]: e["ts"] for e in evs if e.get("cat") == "tensor"}
    for e in evs:
        if e.get("cat") == "partition" and e["name"] == "push":
            st = e["args"]["step"]
            by[(st, e["args"]["server"])].append(((e["ts"] - starts[st]) / 1e3, (e["ts"] + e["dur"] - starts[st]) / 1e3, e["args"]["bytes"]))
    out = []
    for (st, s), v in sorted(by.items()):
        acks = sorted(a for _, a, _ in v)
        gaps = [(b - a, a) for a, b in zip(acks, acks[1:])]
        g, at = max(gaps)
        out.append(f"s{st}/srv{s}: {g:.0f}@{at:.0f}")
    print(f"rank {r}: largest gap between acks per (step, server):", " ".join(out))

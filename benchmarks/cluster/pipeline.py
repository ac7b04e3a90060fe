"""Where a push_pull's time goes against the link, from the workers' timelines.

An operation of M bytes on a link of B bytes/s takes at best M/B.  The partitions'
timestamps (``BYTEPS_TRACE_ON``: ``push`` = sent .. acknowledged, ``server+pull`` =
acknowledged .. result in) split the rest into three stretches, per operation per rank:

- ``fill``: from the operation's start to its first result (nothing comes back until
  every rank pushed some partition and its server sent the sum); ``first 10%``: to the
  result that completes 10 % of the bytes (at the mesh's rate: a tenth of M/B);
- ``steady``: the rate results come in between 10 % and 90 % of the bytes (the middle
  of the pipeline, both directions busy);
- ``drain``: from the last push acknowledged to the last result (the last partitions
  summed and sent back; the uplink is idle); ``last 10%``: from 90 % of the bytes to
  the last result.

    python -m benchmarks.cluster.pipeline TRACE_DIR [--mesh-gbps 0.928]

(``TRACE_DIR``: the folder with one ``<rank>/comm.json`` per worker, e.g. a cluster
run's ``traces/byteps-1gbit-w4``.)
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path


def op_phases(events: list[dict]) -> list[dict]:
    """One dict per traced operation (tensor span) of one rank's Chrome trace events."""
    parts: dict = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "partition":
            parts[(e["args"].get("tensor"), e["args"].get("step"))].append(e)
    out = []
    for t in events:
        if t.get("ph") != "X" or t.get("cat") != "tensor":
            continue
        ps = parts.get((t["name"], t["args"].get("step")), [])
        t0, dur = t["ts"], t["dur"]
        acks = sorted(e["ts"] + e["dur"] - t0 for e in ps if e["name"] == "push")
        res = sorted((e["ts"] + e["dur"] - t0, e["args"].get("bytes", 0)) for e in ps
                     if e["name"] == "server+pull")
        if not acks or not res:
            continue
        total = sum(b for _, b in res)
        got, t10 = 0, None
        for at, b in res:
            got += b
            if t10 is None and got >= 0.1 * total:
                t10, b10 = at, got
            if got >= 0.9 * total:
                t90, b90 = at, got
                break
        steady = (b90 - b10) / ((t90 - t10) / 1e6) if t90 > t10 else None
        out.append({"op_ms": dur / 1e3, "bytes": total, "fill_ms": res[0][0] / 1e3,
                    "first10_ms": t10 / 1e3, "last10_ms": (res[-1][0] - t90) / 1e3,
                    "drain_ms": max(0.0, (res[-1][0] - acks[-1]) / 1e3),
                    "steady_MBps": steady / 1e6 if steady else None,
                    "partitions": len(res)})
    return out


def summary(trace_dir: Path, mesh_gbps: float | None = None) -> dict:
    """Medians over every rank's traced operations; ``mesh_gbps``: the raw mesh's rate
    per link and direction measured in the same run (adds the bound and the ratios)."""
    ops = []
    for f in sorted(Path(trace_dir).glob("*/comm.json")):
        try:
            ops += op_phases(json.loads(f.read_text())["traceEvents"])
        except (OSError, ValueError, KeyError):
            continue
    if not ops:
        return {}
    med = {k: statistics.median(o[k] for o in ops if o[k] is not None)
           for k in ("op_ms", "fill_ms", "drain_ms", "steady_MBps", "bytes", "first10_ms",
                     "last10_ms")}
    med["ops"] = len(ops)
    if mesh_gbps:
        mesh_MBps = mesh_gbps * 1e9 / 8 / 1e6
        med["mesh_bound_ms"] = med["bytes"] / 1e6 / mesh_MBps * 1e3
        med["steady_vs_mesh"] = med["steady_MBps"] / mesh_MBps
        med["op_vs_mesh"] = med["mesh_bound_ms"] / med["op_ms"]
    return med


def table(rows: dict) -> str:
    """``rows``: {name: summary}."""
    rows = {k: v for k, v in rows.items() if v}
    if not rows:
        return ""
    cols = [("op_ms", "op ms", ".0f"), ("mesh_bound_ms", "at mesh", ".0f"),
            ("fill_ms", "fill ms", ".0f"), ("first10_ms", "first 10%", ".0f"),
            ("last10_ms", "last 10%", ".0f"), ("drain_ms", "drain ms", ".0f"),
            ("steady_MBps", "steady MB/s", ".1f"), ("steady_vs_mesh", "steady/mesh", ".2f"),
            ("op_vs_mesh", "op/mesh", ".2f")]
    lines = [f"{'pipeline (median op)':<26}" + "".join(f"{c[1]:>12}" for c in cols)]
    for name, s in rows.items():
        lines.append(f"{name:<26}" + "".join(
            f"{'-' if s.get(k) is None else format(s[k], f):>12}" for k, _, f in cols))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--mesh-gbps", type=float, default=None)
    a = ap.parse_args(argv)
    print(table({a.trace_dir.name: summary(a.trace_dir, a.mesh_gbps)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

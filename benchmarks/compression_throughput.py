"""Throughput of each gradient compressor (byteps.compression) on one CPU core.

    .venv/bin/python benchmarks/compression_throughput.py [--n 16777216] [--repeat 5]

For every compressor (and onebit with error feedback) the best of ``--repeat`` runs of
``compress`` and of ``decompress`` on an ``n``-element float32 gradient, in GB/s of float32
input (4n bytes / seconds), next to ``np.add(x, y, out=z)`` measured in the same run as the
memory-bandwidth yardstick.  Each compress uses a new round number (randomk and dithering
draw their random numbers every round); decompress decodes the frame of that same round,
as the server and the workers do.  Prints a table and writes
benchmarks/results/compression_throughput.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CASES = {
    "onebit": {"compressor": "onebit"},
    "onebit+ef": {"compressor": "onebit", "ef": "vanilla"},
    "int8": {"compressor": "int8"},
    "fp16": {"fp16": True},
    "topk 1%": {"compressor": "topk", "k": 0.01},
    "randomk 1%": {"compressor": "randomk", "k": 0.01},
    "dithering s=4": {"compressor": "dithering", "k": 4},
}
TARGETS = {"onebit": 1.0, "int8": 1.0}  # GB/s each way


def best_of(repeat: int, fn) -> float:
    """Fastest wall time of ``repeat`` calls of ``fn(i)``."""
    best = float("inf")
    for i in range(repeat):
        t0 = time.perf_counter()
        fn(i)
        best = min(best, time.perf_counter() - t0)
    return best


def time_case(pipe, x: np.ndarray, repeat: int) -> tuple[float, float]:
    """Best compress and decompress seconds of one pipeline; round i decodes round i's frame."""
    out, frames = np.empty(x.shape[0], np.float32), {}
    c_s = best_of(repeat, lambda i: frames.__setitem__(i, pipe.compress(x, i)))
    d_s = best_of(repeat, lambda i: pipe.decompress(frames[i], i, out))
    return c_s, d_s


def measure(n: int, repeat: int) -> dict:
    """Results of every case, and of np.add, for an n-element float32 gradient."""
    from byteps.compression import parse, worker_pipeline

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    y, z = rng.standard_normal(n, dtype=np.float32), np.empty(n, np.float32)
    nbytes = 4 * n
    add_s = best_of(repeat, lambda i: np.add(x, y, out=z))
    results = {"np.add": {"compress_gbps": nbytes / add_s / 1e9,
                          "decompress_gbps": nbytes / add_s / 1e9}}
    for name, params in CASES.items():
        pipe = worker_pipeline(parse(params), n, key=1, part=0)
        c_s, d_s = time_case(pipe, x, repeat)
        results[name] = {"compress_gbps": nbytes / c_s / 1e9,
                         "decompress_gbps": nbytes / d_s / 1e9,
                         "frame_bytes": pipe.frame_bytes, "ratio": nbytes / pipe.frame_bytes,
                         "spec": pipe.spec.describe()}
    return results


def table(results: dict) -> str:
    """The results as a fixed-width text table."""
    lines = [f"{'compressor':<15}{'compress GB/s':>15}{'decompress GB/s':>17}{'ratio':>9}",
             "-" * 56]
    for name, r in results.items():
        ratio = f"{r['ratio']:.1f}x" if "ratio" in r else "-"
        lines.append(f"{name:<15}{r['compress_gbps']:>15.2f}{r['decompress_gbps']:>17.2f}"
                     f"{ratio:>9}")
    return "\n".join(lines)


def plot(results: dict, path: Path, n: int) -> None:
    """Grouped bars (compress, decompress) per compressor; np.add as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in results if k != "np.add"]
    pos = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(pos - 0.2, [results[k]["compress_gbps"] for k in names], 0.4, label="compress")
    ax.bar(pos + 0.2, [results[k]["decompress_gbps"] for k in names], 0.4, label="decompress")
    ax.axhline(results["np.add"]["compress_gbps"], color="k", ls="--", lw=1, label="np.add")
    ax.axhline(1.0, color="r", ls=":", lw=1, label="1 GB/s target (onebit, int8)")
    ax.set_xticks(pos, names, rotation=20)
    ax.set_ylabel("GB/s of float32 input")
    ax.set_title(f"byteps.compression, {n:,} float32 elements, one core")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/compression_throughput.json")
    args = ap.parse_args()
    results = measure(args.n, args.repeat)
    print(table(results))
    for name, target in TARGETS.items():
        r = results[name]
        ok = min(r["compress_gbps"], r["decompress_gbps"]) >= target
        print(f"{name}: target {target} GB/s each way {'met' if ok else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"n": args.n, "repeat": args.repeat, "numpy": np.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    plot(results, args.out.with_suffix(".png"), args.n)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

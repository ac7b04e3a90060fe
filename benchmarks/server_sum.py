"""CPU cost of the server's deterministic summation (byteps.server.tree), one process.

    flock /tmp/bench.lock .venv/bin/python benchmarks/server_sum.py [--mb 4] [--rounds 40]
        [--out benchmarks/results/YYYYMMDD-server-sum]

For 2, 3, 4 and 8 pushers and float32 / float16 partitions of ``--mb`` MB, every round's
pushes are applied to a real :class:`byteps.server.store.Slot` in a new random arrival
order (what the server does per partition and round: the tree, its buffers, finishing):
pushes it must not write (a worker's shared memory), and pushes it owns (socket frames,
``writable``: partial sums in place; refilled before each round, not timed).  Compared
with, in the same run:

* the peer: a running sum in arrival order (the store's rule before the tree: the first
  two pushes into the result buffer, the others added in place, float16 in float16);
* the limit: ``n - 1`` element-wise additions of the dtype (what any sum must do), each
  timed alone on warm buffers.

Times are CPU seconds of this thread (``time.thread_time``) per round, median of the
rounds after ``--warm``.  Writes a table (.txt), JSON and a PNG.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.tables import fixed
from byteps.server.store import Slot, apply
from byteps.transport.wire import DTYPE_CODE, PULL, PUSH, Entry


def _median(fn, rounds: int, warm: int, setup=None) -> float:
    ts = []
    for i in range(warm + rounds):
        if setup is not None:
            setup(i)
        t0 = time.thread_time()
        fn(i)
        ts.append(time.thread_time() - t0)
    return float(np.median(ts[warm:]))


def measure(n: int, dtype, length: int, rounds: int, warm: int) -> dict:
    rng = np.random.default_rng(n)
    arrs = [rng.standard_normal(length).astype(dtype) for _ in range(n)]
    code = DTYPE_CODE[np.dtype(dtype)]
    slot = Slot(1, 0, code, length, -1)
    orders = [rng.permutation(n) for _ in range(rounds + warm)]

    def tree(i):
        out: dict = {}
        for r in orders[i]:
            apply(slot, Entry(1, 0, i, PUSH | PULL, code, length), arrs[r], int(r),
                  b"w", n, out)

    own = [a.copy() for a in arrs]        # received socket frames: the server's to overwrite
    wslot = Slot(1, 0, code, length, -1)

    def fresh(i):
        for a, b in zip(own, arrs):
            np.copyto(a, b)

    def tree_frames(i):
        out: dict = {}
        for r in orders[i]:
            apply(wslot, Entry(1, 0, i, PUSH | PULL, code, length), own[r], int(r),
                  b"w", n, out, writable=True)

    bufs = [np.empty(length, dtype) for _ in (0, 1)]

    def running(i):
        o, acc = orders[i], bufs[i % 2]
        np.add(arrs[o[0]], arrs[o[1]], out=acc)
        for r in o[2:]:
            np.add(acc, arrs[r], out=acc)

    one = _median(lambda i: np.add(arrs[0], arrs[1], out=bufs[0]), rounds, warm)
    t, p = _median(tree, rounds, warm), _median(running, rounds, warm)
    f = _median(tree_frames, rounds, warm, fresh)
    return {"pushers": n, "dtype": np.dtype(dtype).name, "mb": length * arrs[0].itemsize / 2**20,
            "tree_ms": t * 1e3, "frames_ms": f * 1e3, "running_ms": p * 1e3, "limit_ms": (n - 1) * one * 1e3,
            "vs_running": t / p, "vs_limit": t / ((n - 1) * one), "frames_vs_running": f / p,
            "pool_buffers": len(slot.pool.free)}


def table(rows: list) -> str:
    cols = (("pushers", 7, ""), ("dtype", 8, ""), ("tree ms", 8, ".2f"), ("frames ms", 9, ".2f"),
            ("running ms", 10, ".2f"), ("limit ms", 9, ".2f"), ("x running", 9, ".2f"),
            ("frames x", 8, ".2f"), ("x limit", 8, ".2f"), ("pool", 5, ""))
    return fixed(cols, [[r[k] for k in ("pushers", "dtype", "tree_ms", "frames_ms", "running_ms",
                                        "limit_ms", "vs_running", "frames_vs_running",
                                        "vs_limit", "pool_buffers")] for r in rows])


def plot(rows: list, path: Path, mb: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(rows))
    for k, (key, label) in enumerate((("tree_ms", "tree, read-only pushes (shm)"),
                                      ("frames_ms", "tree, socket frames"),
                                      ("running_ms", "running sum (before)"),
                                      ("limit_ms", "n-1 additions (limit)"))):
        ax.bar(x + (k - 1.5) * 0.2, [r[key] for r in rows], 0.2, label=label)
    ax.set_xticks(x, [f"{r['pushers']} x {r['dtype']}" for r in rows], fontsize=8)
    ax.set_ylabel("CPU ms per round")
    ax.set_title(f"server summation of one {mb:g} MB partition per round")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warm", type=int, default=5)
    day = datetime.date.today().strftime("%Y%m%d")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"{day}-server-sum"))
    args = ap.parse_args()
    rows = []
    for dtype in (np.float32, np.float16):
        length = int(args.mb * 2**20) // np.dtype(dtype).itemsize
        for n in (2, 3, 4, 8):
            rows.append(measure(n, dtype, length, args.rounds, args.warm))
    res = {"mb": args.mb, "rounds": args.rounds, "loadavg": os.getloadavg(), "rows": rows,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    text = table(rows)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "server_sum.json").write_text(json.dumps(res, indent=1))
    (out / "server_sum.txt").write_text(text + "\n")
    plot(rows, out / "server_sum.png", args.mb)
    print(f"wrote {out}/server_sum.{{json,txt,png}}")


if __name__ == "__main__":
    main()

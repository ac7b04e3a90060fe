"""Autotune job for tests/test_autotune_cut.py: under local reduction or not, push_pull a
plain tensor (exact integer sums, checked every step) and a randomk + error-feedback
tensor for ``steps`` explicit steps while autotune tries partition sizes.

randomk makes the check exact: the server re-compresses the sum at the same positions,
so its own residual stays zero, and with integer gradients every rank's error feedback
is exact arithmetic.  Hence, summed over the steps, what every rank received equals the
sum of all gradients less the final residuals of the pipelines that compressed (one per
rank, or per host under local reduction) — exactly, however often the tensor was cut
anew, if and only if each re-cut carried the residual to the right elements.  Each rank
writes out_dir/rank<r>.json: per step the layout keys and partition counts of both
tensors, the tuner's changes and choice, the plain sums' failures and the identity's
largest error.

argv: out_dir steps plain_bytes comp_elements
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

import byteps.numpy as bps
from byteps.core import api

COMP = {"compressor": "randomk", "k": 0.25, "ef": "vanilla", "seed": 7}


def layout(name: str) -> list:
    """[key, partitions] this rank uses for ``name`` now."""
    st = api._STATE
    red = st.local
    if red is None:
        t = st.tensors[name]
        return [t.key, len(t.parts)]
    lkey = red.cuts.layouts[name]
    return [lkey, red.segs[lkey].C]


def residual(name: str, n: int) -> np.ndarray:
    """This rank's error-feedback residual of ``name`` as one whole-tensor array (zeros
    where this rank compresses nothing)."""
    st, whole = api._STATE, np.zeros(n, np.float32)
    red = st.local
    if red is None:
        t = st.tensors[name]
        pieces = [(start, t.pipes[part]) for part, start, _, _ in t.parts if part in t.pipes]
    else:
        lkey = red.cuts.layouts[name]
        seg = red.segs[lkey]
        pieces = [(seg.slice(j, k)[0], p) for k, sl in enumerate(red.slice_cache.get(lkey, []))
                  for j, p in sl.pipes.items()]
    for start, p in pieces:
        whole[start:start + p.n] += p.residual
    return whole


def slice_keys(name: str) -> list:
    """The keys of the slices of ``name``'s current cut (local reduction)."""
    red = api._STATE.local
    return [] if red is None else [sl.key for sl in red.slice_cache[red.cuts.layouts[name]]]


def segments() -> list:
    """The local reduction's shared segments of this host (file names) left at the end."""
    red = api._STATE.local
    if red is None:
        return []
    return sorted(f for f in os.listdir(red.dir) if f.startswith(red.prefix + "t"))


def main() -> None:
    out_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    plain_n, comp_n = int(sys.argv[3]) // 4, int(sys.argv[4])
    bps.init()
    r, n = bps.rank(), bps.size()
    plain = np.arange(plain_n, dtype=np.float32) + r
    want = np.arange(plain_n, dtype=np.float32) * n + n * (n - 1) / 2
    got_sum = np.zeros(comp_n, np.float64)
    grad_sum = np.zeros(comp_n, np.float64)
    layouts, failures = [], []
    for step in range(steps):
        got = bps.push_pull(plain, "cut.plain", average=False)
        if not np.array_equal(got, want):
            failures.append(step)
        # integer gradients: every rank knows every rank's, so the sum is known exactly
        grads = [np.random.default_rng([q, step]).integers(-8, 9, comp_n).astype(np.float32)
                 for q in range(n)]
        got_sum += bps.push_pull(grads[r], "cut.comp", average=False, compression_params=COMP)
        grad_sum += np.sum(grads, axis=0, dtype=np.float64)
        layouts.append([step, layout("cut.plain"), layout("cut.comp")])
        bps.step_done()
    res = bps.push_pull(residual("cut.comp", comp_n), "cut.residual", average=False)
    err = float(np.max(np.abs(got_sum - (grad_sum - res))))
    tu = api._STATE.tuner
    doc = {"rank": r, "layouts": layouts, "failures": failures, "identity_error": err,
           "received_abs": float(np.max(np.abs(got_sum))),
           "residual_abs": float(np.max(np.abs(res))),
           "choice": None if tu is None or tu.choice is None else list(tu.choice),
           "changes": None if tu is None else tu.changes,
           "state": None if tu is None else tu.state,
           "base_keys": [api.tensor_key("cut.plain"), api.tensor_key("cut.comp")],
           "local": api._STATE.local is not None, "segments": segments(),
           "slice_keys": slice_keys("cut.plain") + slice_keys("cut.comp")}
    (out_dir / f"rank{r}.json").write_text(json.dumps(doc))
    bps.barrier()


if __name__ == "__main__":
    main()

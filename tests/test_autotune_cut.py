"""Autotune re-cuts tensors under local reduction and compressed tensors too
(docs/scaling.md, "Autotune"): in a real job every rank (and every local rank) goes
through the same partition sizes at the same step boundaries, a re-cut tensor moves to a
fresh key, plain sums stay exact, and the error-feedback residual is carried per element
across every re-cut (an exact identity with randomk, see tests/scripts/autotune_cut_job.py);
under local reduction the old cuts' shared segments are gone and, after the final choice,
the servers hold only the final cut's slice keys; the carry itself is checked without
sockets too."""
from __future__ import annotations

import json

import numpy as np
import pytest

from byteps import compression
from conftest import assert_ok, read_results, run_script

INITIAL = 4096000


def test_carry_state_moves_residual_and_momentum_per_element():
    spec = compression.parse({"compressor": "topk", "k": 0.5, "ef": "vanilla",
                              "momentum": "nesterov", "mu": 0.9})
    n, rng = 1000, np.random.default_rng(0)
    old = [(s, compression.worker_pipeline(spec, m, 1, i))
           for i, (s, m) in enumerate([(0, 300), (300, 300), (600, 400)])]
    for s, p in old:
        for rnd in range(3):
            p.compress(rng.standard_normal(p.n).astype(np.float32), rnd)
    whole_r = np.concatenate([p.residual for _, p in old])
    whole_m = np.concatenate([p.momentum for _, p in old])
    assert np.abs(whole_r).max() > 0 and np.abs(whole_m).max() > 0
    new = [(s, compression.worker_pipeline(spec, m, 2, i))
           for i, (s, m) in enumerate([(0, 128), (128, 512), (640, 360)])]
    compression.carry_state(old, new, n)
    np.testing.assert_array_equal(np.concatenate([p.residual for _, p in new]), whole_r)
    np.testing.assert_array_equal(np.concatenate([p.momentum for _, p in new]), whole_m)
    # elements no old pipeline held (another local rank's) start at zero
    part = [(s, compression.worker_pipeline(spec, m, 3, i))
            for i, (s, m) in enumerate([(0, 500), (500, 500)])]
    compression.carry_state(old[:1], part, n)
    np.testing.assert_array_equal(part[0][1].residual[:300], whole_r[:300])
    assert not part[0][1].residual[300:].any() and not part[1][1].residual.any()


def _check(tmp_path, res, ranks):
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == list(range(ranks)), res.stderr[-3000:]
    first = out[0]
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: wrong plain sums at steps {doc['failures']}"
        # exact: received = all gradients - final residuals, across every re-cut
        assert doc["identity_error"] == 0.0, (r, doc)
        assert doc["received_abs"] > 0 and doc["residual_abs"] > 0, doc
        # every rank (every local rank too) switched alike, cut alike, chose alike
        assert doc["changes"] == first["changes"] and doc["choice"] == first["choice"], (r, doc)
        assert doc["layouts"] == first["layouts"], r
    assert first["choice"] is not None and first["state"] in ("defer", "verify", "done")
    changes = {step: size for step, size, _ in first["changes"]}
    assert any(size != INITIAL for size in changes.values()), "no trial changed the size"
    size, keys = INITIAL, [set(), set()]
    for step, *tensors in first["layouts"]:
        size = changes.get(step, size)
        for i, (key, parts) in enumerate(tensors):
            keys[i].add(key)
            # the initial size's cut keeps the name's key; another cut has its own
            assert (key == first["base_keys"][i]) == (size == INITIAL or parts == 1), \
                (step, size, i, key, parts)
    assert len(keys[0]) > 1 and len(keys[1]) > 1, keys    # both were re-cut
    return out


@pytest.mark.timeout(120)
def test_compressed_tensors_are_recut_with_their_residuals(tmp_path):
    res = run_script("autotune_cut_job.py", tmp_path, 8, 8_000_000, 1_000_000, workers=2,
                     servers=2, timeout=110, BYTEPS_AUTOTUNE_STEPS=1)
    out = _check(tmp_path, res, 2)
    assert not out[0]["local"]


@pytest.mark.timeout(150)
def test_local_reduction_is_recut_alike_on_every_local_rank(tmp_path):
    res = run_script("autotune_cut_job.py", tmp_path, 8, 8_000_000, 1_000_000, workers=4,
                     servers=2, timeout=140, BYTEPS_AUTOTUNE_STEPS=1,
                     BYTEPS_TEST_RECORD=str(tmp_path / "rec"),
                     launcher_args=("--hosts", "2", "--local-size", "2"))
    out = _check(tmp_path, res, 4)
    assert out[0]["local"]
    # the shared segments of the cuts left behind are gone; the current ones remain
    last = out[0]["layouts"][-1]
    old = {key for _, *ts in out[0]["layouts"] for key, _ in ts} - {k for k, _ in last[1:]}
    for r, doc in out.items():
        names = " ".join(doc["segments"])
        assert all(f"t{k:016x}" in names for k, _ in last[1:]), (r, doc["segments"])
        assert not [k for k in old if f"t{k:016x}" in names], (r, old, doc["segments"])
    # after the final choice the servers were asked to free the slice keys of the other
    # cuts: each ends holding only the final cut's slices
    final = set(out[0]["slice_keys"])
    assert len(final) == 4 and all(set(d["slice_keys"]) == final for d in out.values())
    servers = [json.loads(p.read_text()) for p in tmp_path.glob("rec.bytes.*.json")]
    assert len(servers) == 2, res.stderr[-3000:]
    held = {k for s in servers for k, name in s["keys"]
            if name.startswith(("cut.plain.slice", "cut.comp.slice"))}
    assert held == final, ([x["keys"] for x in servers], final)
    assert all(s["keys_freed"] > 0 and s["free_refused"] == 0 for s in servers), servers

"""Gradient compression through real jobs (bpslaunch --standalone, numpy workers).

The compressors themselves are checked against numpy references in
test_compression_unit.py; here the whole two-level pipeline (worker momentum /
error feedback / compressor -> server decompress, sum, compress -> worker
decompress) must equal a single-process reference bit for bit, bytes on the
wire are counted at the server, and malformed compressed frames from a worker
with the job's secret are dropped while results stay exact.
"""
import json

import numpy as np
import pytest

from conftest import assert_ok, read_results, run_script

pytestmark = pytest.mark.timeout(200)
PARTS = {"BYTEPS_PARTITION_BYTES": 65536}


def test_every_compressor_equals_the_reference_pipeline(tmp_path):
    res = run_script("compress_pushpull.py", tmp_path, "exact", workers=2, servers=2,
                     timeout=150, **PARTS)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    for r, o in out.items():
        assert o["failures"] == [], f"rank {r}: {o['failures']}"
    b = out[0]["bytes"]
    raw = 3 * 50_001 * 4
    assert b["grad.onebit"]["pushed"] == raw
    assert b["grad.onebit"]["pushed_wire"] < raw / 25          # 1 bit + a scale per part
    assert b["grad.fp16"]["pushed_wire"] == raw // 2
    assert b["grad.int8"]["pulled_wire"] < raw / 3.5
    assert b["grad.topk"]["pushed_wire"] < raw * 0.025


def test_ranks_with_different_compression_get_an_error_naming_both(tmp_path):
    res = run_script("compress_pushpull.py", tmp_path, "mismatch", workers=2, servers=1,
                     timeout=60)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr
    for o in out.values():
        err = o["error"]
        assert err and "layer.w" in err and "rank 0" in err and "rank 1" in err, err
        assert "onebit" in err and "topk" in err, err
        assert o["seconds"] < 10
        assert "differs from its first use" in o["local_error"]


@pytest.mark.parametrize("compressor,limit", [("onebit", 1 / 28), ("topk", 0.025),
                                              ("none", 1.01)])
def test_bytes_on_the_wire_counted_at_the_server(tmp_path, compressor, limit):
    rec = tmp_path / "rec.txt"
    res = run_script("compress_pushpull.py", tmp_path, "bytes", compressor, workers=2,
                     servers=1, timeout=60, BYTEPS_TEST_RECORD=rec)
    assert_ok(res)
    counts = [json.loads(p.read_text()) for p in tmp_path.glob("rec.txt.bytes.*.json")]
    assert len(counts) == 1
    wire = counts[0]["wire_total"]                 # every frame, headers and MACs included
    raw = 2 * (1 << 20) * 4                        # 2 workers x 4 MB
    assert wire <= limit * raw, f"{compressor}: {wire} bytes on the wire for {raw} raw"
    if compressor != "none":
        assert wire < raw / 10


def test_malformed_compressed_frames_are_dropped_and_results_stay_exact(tmp_path):
    res = run_script("compress_pushpull.py", tmp_path, "hostile", workers=2, servers=2,
                     timeout=120, BYTEPS_LOG_LEVEL="WARNING", **PARTS)
    assert_ok(res)
    out = read_results(tmp_path)
    assert out[1]["malformed_sent"] >= 20
    for r, o in out.items():
        assert o["failures"] == [], f"rank {r}: {o['failures']}"
    assert "malformed compressed push" in res.stderr + res.stdout


@pytest.mark.parametrize("mode", ["root", "slice"])
def test_compression_after_local_reduction(tmp_path, mode):
    """2 hosts x 2 local ranks: ranks of a host sum in shared memory at full precision,
    only what leaves the host is compressed; all 4 ranks end identical."""
    res = run_script("compress_pushpull.py", tmp_path, "local", workers=4, servers=2,
                     timeout=120, launcher_args=("--hosts", "2", "--local-size", "2"),
                     BYTEPS_LOCAL_REDUCE=mode)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1, 2, 3]
    for r, o in out.items():
        assert o["failures"] == [], f"rank {r}: {o['failures']}"
        assert o["digests"] == out[0]["digests"], f"rank {r} differs from rank 0"
    wire = sum(v["pushed_wire"] for o in out.values() for k, v in o["bytes"].items()
               if k.startswith("loc.onebit"))
    raw = sum(v["pushed"] for o in out.values() for k, v in o["bytes"].items()
              if k.startswith("loc.onebit"))
    assert 0 < wire < raw / 25, (wire, raw)


def test_timeline_has_compress_and_decompress_spans(tmp_path):
    traces, out = tmp_path / "traces", tmp_path / "out"
    out.mkdir()
    res = run_script("trace_pushpull.py", out, workers=2, servers=1, timeout=120,
                     BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=traces, BYTEPS_PARTITION_BYTES=400_000,
                     TRACE_COMPRESSION=json.dumps({"compressor": "onebit", "ef": "vanilla"}))
    assert_ok(res)
    for rank in (0, 1):
        doc = json.loads((traces / str(rank) / "comm.json").read_text())
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "compress"]
        # 1.2 MB weight in 400 KB partitions: 3 compress + 3 decompress per step
        names = [e["name"] for e in spans]
        assert names.count("compress") >= 3 and names.count("decompress") >= 3, names
        assert {e["args"]["tensor"] for e in spans} == {"layer.weight"}


@pytest.mark.parametrize("compressor,layout", [
    ("onebit", "flat"), ("int8", "local"), ("onebit", "replicas"), ("fp16", "flat")])
def test_inf_or_nan_on_one_rank_gives_nan_on_every_rank_and_the_job_goes_on(
        tmp_path, compressor, layout):
    """onebit and int8 cannot encode inf or NaN, and error feedback (here with every
    compressor, fp16 too) would keep them for good.  A rank whose partition holds them pushes
    it as NONFINITE and that round's result of the partition is NaN on every rank (what an
    uncompressed sum gives), so a loop that skips non-finite steps (loss scaling) skips
    the same step everywhere; the next rounds are exact again.  Before, that rank's
    push_pull failed alone: the job ended, or, where the rank caught the error and went
    on, the others waited for its push forever.  Flat 2 ranks;
    2 hosts x 2 local ranks (the host's sum holds the NaN and the inf); 2 servers with a
    backup each (the result is replicated)."""
    workers, servers, args, env = {
        "flat": (2, 1, (), {}),
        "local": (4, 1, ("--hosts", "2", "--local-size", "2"), {}),
        "replicas": (2, 2, (), {"BYTEPS_SERVER_REPLICAS": "1"})}[layout]
    res = run_script("compress_nonfinite.py", tmp_path, compressor, workers=workers,
                     servers=servers, launcher_args=args, timeout=90,
                     BYTEPS_MIN_COMPRESS_BYTES=0, BYTEPS_PARTITION_BYTES=4000, **env)
    assert_ok(res)
    ranks = read_results(tmp_path)
    assert sorted(ranks) == list(range(workers))
    mean = (workers + 1) / 2
    for r, got in ranks.items():
        for step, (finite, firsts, nans) in enumerate(got["steps"]):
            if step == 3:       # partition 1 (elements 1000-1999) is NaN, the others exact
                assert not finite and nans == 1000 and firsts[0] == firsts[2] == mean, \
                    (r, step, got["steps"][step])
            else:
                assert finite and firsts == [mean] * 3, (r, step, got["steps"][step])
        assert got["applied"] == 6, (r, got)
    assert "holds inf or NaN" in res.stderr and "NaN on every rank" in res.stderr


def test_inf_or_nan_in_a_diloco_outer_gradient_reaches_every_rank_not_a_hang(tmp_path):
    """DiLoCo with int8 outer gradients, one rank's local model NaN after step 4: its outer
    gradient's partition goes out as NONFINITE and the servers' outer step makes that
    partition of the global parameters NaN, as an uncompressed outer gradient would;
    every rank pulls them at the round's end and the job ends.  Before, that rank's step
    failed alone and the others waited."""
    res = run_script("compress_nonfinite.py", tmp_path, "int8", "diloco", workers=2,
                     timeout=90, BYTEPS_MIN_COMPRESS_BYTES=0, BYTEPS_PARTITION_BYTES=4000)
    assert_ok(res)
    ranks = read_results(tmp_path)
    assert ranks[1]["nans"][4] == 1 and ranks[0]["nans"][4] == 0      # its own step
    for r in (0, 1):       # the round of steps 3-5 ends at step 5: partition 1 NaN on both
        assert ranks[r]["nans"][:4] == [0] * 4 and ranks[r]["nans"][5:] == [1000] * 5, ranks
    assert "global parameters of the partition become NaN" in res.stderr


@pytest.mark.parametrize("comp", ["none", "onebit"])
def test_torch_loss_scaling_skips_an_overflow_on_every_rank(tmp_path, comp):
    """A real loss scaler (torch.amp.GradScaler on CPU, Horovod's recipe), rank 1's loss
    inf in step 2: every rank skips that step (parameters unchanged, scale halved) and the
    ranks stay identical, uncompressed and with onebit + error feedback.  With onebit the
    job used to end there: rank 1's gradients could not be compressed."""
    res = run_script("torch_amp_nonfinite.py", tmp_path, comp, workers=2, timeout=120,
                     BYTEPS_MIN_COMPRESS_BYTES=0)
    assert_ok(res)
    ranks = read_results(tmp_path)
    assert ranks[0] == ranks[1], ranks                        # one model, one scale
    log = ranks[0]
    assert [s for s, _ in log] == [1024.0, 1024.0, 512.0, 512.0, 512.0, 512.0], log
    assert log[2][1] == log[1][1] and len({d for _, d in log}) == 5, log   # step 2 skipped


def test_torch_loss_scaling_skips_an_overflow_on_every_rank_of_a_process_set(tmp_path):
    """The same on process sets ([0, 2] and [1, 3], 2 hosts x 2), whose compressed
    allreduce is the sets' own (core/collective/set_ops.py): rank 2's loss inf in step 2,
    so set [0, 2] skips that step on both of its ranks and [1, 3] does not.  Before, rank
    2's compression raised alone and the job ended."""
    res = run_script("torch_amp_nonfinite.py", tmp_path, "procset", workers=4, timeout=120,
                     launcher_args=("--hosts", "2", "--local-size", "2"),
                     BYTEPS_MIN_COMPRESS_BYTES=0)
    assert_ok(res)
    ranks = read_results(tmp_path)
    assert ranks[0] == ranks[2] and ranks[1] == ranks[3], ranks
    assert [s for s, _ in ranks[0]] == [1024.0] * 2 + [512.0] * 4, ranks[0]
    assert ranks[0][2][1] == ranks[0][1][1], ranks[0]                 # skipped
    assert [s for s, _ in ranks[1]] == [1024.0] * 6 and \
        len({d for _, d in ranks[1]}) == 6, ranks[1]                   # the other set did not


def test_inf_or_nan_in_a_decentralized_model_reaches_its_peers_not_a_hang(tmp_path):
    """Decentralized with onebit model differences, rank 1's model NaN at step 3: its
    difference goes out as non-finite (a status byte after the frame), both replicas take
    NaN and the models become NaN on both ranks, as an uncompressed exchange gives; the
    job ends.  Before, rank 1's compression raised alone and its peer waited for it."""
    res = run_script("compress_nonfinite.py", tmp_path, "onebit", "decentralized",
                     workers=2, timeout=90, BYTEPS_MIN_COMPRESS_BYTES=0)
    assert_ok(res)
    ranks = read_results(tmp_path)
    for r in (0, 1):
        assert ranks[r]["nans"][:3] == [0] * 3 and ranks[r]["nans"][3:] == [3000] * 7, ranks


def _keras_loss_scaling(tmp_path, comp) -> dict:
    tmp_path.mkdir(exist_ok=True)
    res = run_script("keras_loss_scaling.py", tmp_path, comp, workers=2, timeout=150,
                     BYTEPS_MIN_COMPRESS_BYTES=0)
    assert_ok(res)
    ranks = read_results(tmp_path)
    assert ranks[0] == ranks[1], ranks
    assert ranks[0]["scale"] == 2.0 ** 13 and ranks[0]["steps"] == 6, ranks[0]
    assert ranks[0]["finite"], ranks[0]
    assert ("holds inf or NaN" in res.stderr) == (comp == "onebit"), res.stderr[-3000:]
    return ranks[0]


@pytest.mark.parametrize("comp", ["none", "onebit", "policy", "policy_qadam"])
def test_keras_loss_scaling_skips_an_overflow_on_every_rank(tmp_path, comp):
    """Keras 3's LossScaleOptimizer and byteps's DistributedOptimizer, model.fit on 2
    hosts, rank 1's batch 2 of each epoch overflowing: every rank skips those two steps
    (6 of 8 applied), halves its scale twice and ends with the same finite weights.  The
    scaler inside (Horovod's order), uncompressed and with onebit + error feedback (rank 1's
    partitions go out NONFINITE); and outside, as model.compile wraps it under the
    mixed_float16 policy, of Adam and of QAdam past its warm-up (before, rank 1 skipped its
    exchange alone and the job failed at the end, its ranks' rounds parted)."""
    _keras_loss_scaling(tmp_path, comp)


def test_keras_loss_scaler_outside_takes_horovods_steps(tmp_path):
    """LossScaleOptimizer(DistributedOptimizer(Adam)) in float32 ends bit-identical to
    Horovod's order, DistributedOptimizer(LossScaleOptimizer(Adam)): the scale is a power
    of 2, so unscaling before or after the average gives the same sums."""
    assert _keras_loss_scaling(tmp_path / "outer", "outer")["digest"] == \
        _keras_loss_scaling(tmp_path / "none", "none")["digest"]


def test_qadam_under_a_loss_scaler_after_the_exchange_is_refused():
    """torch's GradScaler.step(QAdam) and Keras's DistributedOptimizer(LossScaleOptimizer(
    QAdam)) raise the core's rule qadam-loss-scale (the momentum would carry the scale)."""
    torch = pytest.importorskip("torch")
    import byteps.torch as bpt
    m = torch.nn.Linear(4, 1)
    opt = bpt.QAdamOptimizer(m.parameters(), lr=1e-3, warmup_steps=2)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(m(torch.ones(8, 4)).pow(2).mean()).backward()
    with pytest.raises(Exception, match="rule 'qadam-loss-scale'"):
        scaler.step(opt)
    opt.step()                                 # without the scaler: QAdam as before
    keras = pytest.importorskip("keras")
    import byteps.keras as bpk
    inner = keras.mixed_precision.LossScaleOptimizer(bpk.QAdamOptimizer(learning_rate=0.01))
    with pytest.raises(Exception, match="rule 'qadam-loss-scale'"):
        bpk.DistributedOptimizer(inner)


@pytest.mark.parametrize("layout", ["flat", "root", "slice"])
def test_take_residual_moves_what_compression_left_unsent(tmp_path, layout):
    """``api.take_residual`` (AsyncModelAverage keeps in each model what its push left
    unsent): the ranks that push for a host get the host's whole error-feedback residual,
    and what their pushes then carried, input minus residual, is onebit's one magnitude
    per partition; the residual is emptied, and ranks or names without one get False."""
    local = ("--hosts", "2", "--local-size", "2") if layout != "flat" else ()
    res = run_script("take_residual.py", tmp_path, workers=4 if local else 2, servers=2,
                     timeout=120, launcher_args=local, BYTEPS_PARTITION_BYTES=16384,
                     **({"BYTEPS_LOCAL_REDUCE": layout} if local else {}))
    assert_ok(res)
    out = read_results(tmp_path)
    hosts: dict = {}
    for r, o in out.items():
        assert not o["unknown"] and not o["plain"], r
        assert o["zero_after"] and (o["again"] or not o["got"]), r
        hosts.setdefault(o["host"], []).append(o)
    assert len(hosts) == 2
    for host, ranks in hosts.items():
        pushers = [o for o in ranks if o["got"]]
        # flat: each rank pushes for itself; root mode: local rank 0; slice: both
        assert len(pushers) == {"flat": 1, "root": 1, "slice": 2}[layout], (host, layout)
        assert all(o["held"] for o in pushers)
        x = np.sum([np.array(o["x"], np.float32) for o in ranks], axis=0, dtype=np.float32)
        kept = np.sum([np.array(o["out"], np.float32) for o in ranks], axis=0)
        assert np.abs(kept).max() > 0.1
        sent = np.abs(x.astype(np.float64) - kept)
        # onebit sends sign x mean magnitude per pipeline (one per partition a rank
        # pushes for the host): that many magnitudes, each in one run, where the input
        # has 20000 distinct ones (a misplaced or partial residual breaks both); 1e-4
        # separates them beyond float32 rounding
        n = sum(o["held"] for o in pushers)
        mags = 1 + np.count_nonzero(np.diff(np.sort(sent)) > 1e-4)
        runs = 1 + np.count_nonzero(np.abs(np.diff(sent)) > 1e-4)
        assert mags <= n and runs <= n, (host, mags, runs, n)

"""Horovod's Adasum (byteps/core/collective/adasum.py, byteps/core/algorithms/adasum.py):
the pairwise combination and Horovod's tree, allreduce(op=Adasum) in a job (identical on
every rank, equal to the tree of every rank's tensor), its refusals, and the Adasum
optimizer (op=hvd.Adasum) against a one-process replay."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

from byteps.core.collective import adasum

pytestmark = pytest.mark.timeout(180)


def test_combination_and_tree():
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    np.testing.assert_allclose(adasum.combine(a, b), a + b)            # orthogonal: a sum
    np.testing.assert_allclose(adasum.combine(a, a), a)                # equal: taken once
    np.testing.assert_allclose(adasum.combine(2 * a, 4 * a), 3 * a)    # parallel: the mean
    np.testing.assert_allclose(adasum.combine(np.zeros(3), b), b)      # a zero norm: coeff 1
    c = np.array([1.0, 1.0, 0.0])
    dot = a @ c
    want = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (c @ c))) * c
    np.testing.assert_allclose(adasum.combine(a, c), want)
    rows = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    pairs = adasum.combine(adasum.combine(rows[0], rows[1]), adasum.combine(rows[2], rows[3]))
    assert np.array_equal(adasum.tree(rows), pairs)          # Horovod's pairing: (0,1),(2,3)
    assert adasum.tree(rows.astype(np.float16)).dtype == np.float16
    with pytest.raises(ValueError, match="power-of-2 number of ranks; there are 3"):
        adasum.check("allreduce of 'x'", np.float32, 3)
    with pytest.raises(ValueError, match="float16, float32 or float64 tensors"):
        adasum.check("allreduce of 'x'", np.int64, 4)


def test_allreduce_adasum_in_a_job(tmp_path):
    """4 ranks on 2 hosts of 2: every rank gets the tree of the 4 tensors in rank order."""
    res = run_script("adasum_job.py", tmp_path, "allreduce", workers=4, servers=2,
                     launcher_args=("--hosts", "2", "--local-size", "2"), timeout=150)
    assert_ok(res)
    got = read_results(tmp_path)
    assert sorted(got) == [0, 1, 2, 3]
    for dt in ("float32", "float64", "float16"):
        rows = [np.array(got[r][dt]["mine"], dt) for r in range(4)]
        want = adasum.tree([x.ravel() for x in rows]).reshape(rows[0].shape)
        for r in range(4):
            assert got[r][dt]["dtype"] == dt
            assert np.array_equal(np.array(got[r][dt]["got"], dt), want), (dt, r)
    # rows 2, 4, 6, 8 (prescale 2) are parallel: Adasum averages them, then postscale 0.5
    assert all(got[r]["scaled"] == [2.5] * 4 for r in range(4))
    assert all("float16, float32 or float64" in got[r]["bad_int"] for r in range(4))


def test_adasum_needs_a_power_of_2_ranks_and_the_job_goes_on(tmp_path):
    res = run_script("adasum_job.py", tmp_path, "allreduce", workers=3, servers=1,
                     timeout=120)
    assert_ok(res)
    got = read_results(tmp_path)
    assert all("power-of-2 number of ranks; there are 3" in got[r]["refused"]
               for r in range(3)), got


def test_numpy_optimizer_with_the_adasum_algorithm(tmp_path):
    res = run_script("adasum_job.py", tmp_path, "numpy", workers=4, servers=1, timeout=120)
    assert_ok(res)
    got = read_results(tmp_path)
    deltas = [-0.5 * (np.eye(3)[r % 3] + 0.1 * r) for r in range(4)]
    want = adasum.tree(deltas)
    for r in range(4):
        np.testing.assert_allclose(got[r]["w"], want, rtol=0, atol=1e-15)


def test_torch_distributed_optimizer_op_adasum_equals_a_replay(tmp_path):
    """Horovod's Adasum optimizer: each rank's Adam step from the common parameters, the
    deltas combined by Adasum, the same parameters everywhere, as a one-process replay."""
    torch = pytest.importorskip("torch")
    res = run_script("adasum_job.py", tmp_path, "torch", workers=2, servers=1, timeout=150)
    assert_ok(res)
    got = read_results(tmp_path)
    torch.manual_seed(0)
    shared = torch.nn.Linear(4, 2)             # rank 0's start (broadcast)
    models = [torch.nn.Linear(4, 2) for _ in range(2)]
    opts = [torch.optim.Adam(m.parameters(), lr=0.1) for m in models]
    gens = [torch.Generator().manual_seed(10 + r) for r in range(2)]
    for _ in range(3):
        deltas = []
        for r in range(2):
            with torch.no_grad():
                for p, s in zip(models[r].parameters(), shared.parameters()):
                    p.copy_(s)
            x, y = torch.randn(8, 4, generator=gens[r]), torch.randn(8, 2, generator=gens[r])
            opts[r].zero_grad()
            torch.nn.functional.mse_loss(models[r](x), y).backward()
            opts[r].step()
            deltas.append([(p - s).detach().numpy() for p, s in
                           zip(models[r].parameters(), shared.parameters())])
        with torch.no_grad():
            for i, s in enumerate(shared.parameters()):
                comb = adasum.tree([d[i].ravel() for d in deltas]).reshape(s.shape)
                s.add_(torch.from_numpy(comb))
    for r in range(2):
        assert got[r] == got[0]                                   # identical ranks
        np.testing.assert_allclose(got[r]["weight"], shared.weight.detach().numpy(),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got[r]["bias"], shared.bias.detach().numpy(),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("plugin", ["keras", "tensorflow"])
def test_keras_distributed_optimizer_op_adasum(tmp_path, plugin):
    """Keras: DistributedOptimizer(SGD, op=hvd.Adasum) in model.fit (byteps.tensorflow.keras's
    and byteps.tensorflow's): each rank's SGD step from the broadcast weights, the changes
    combined by Adasum, identical ranks."""
    pytest.importorskip("tensorflow")
    res = run_script("keras_adasum.py", tmp_path, plugin, workers=2, servers=1, timeout=170)
    assert_ok(res)
    got = read_results(tmp_path)
    assert got[0]["after"] == got[1]["after"]
    for i, start in enumerate(got[0]["start"]):
        start = np.array(start, np.float32)
        deltas = [(-0.5 * np.array(got[r]["grads"][i], np.float32)).ravel() for r in range(2)]
        want = start + adasum.tree(deltas).reshape(start.shape)
        np.testing.assert_allclose(got[0]["after"][i], want, rtol=1e-5, atol=1e-6)


def test_tensorflow_gradient_tape_op_adasum(tmp_path):
    """DistributedGradientTape(op=hvd.Adasum): the gradients combined with Adasum before
    they are returned (Horovod's tape), so every rank applies the same update."""
    pytest.importorskip("tensorflow")
    res = run_script("tape_adasum.py", tmp_path, workers=2, servers=1, timeout=170)
    assert_ok(res)
    got = read_results(tmp_path)
    assert got[0]["after"] == got[1]["after"]
    w = np.array(got[0]["before"][0], np.float32)
    for step in range(2):
        np.testing.assert_allclose(got[0]["before"][step], w, rtol=1e-6)
        g = adasum.tree([np.array(got[r]["local"][step], np.float32).ravel()
                         for r in range(2)]).reshape(w.shape)
        w = w - 0.5 * g
    np.testing.assert_allclose(got[0]["after"], w, rtol=1e-5, atol=1e-6)


def test_where_adasum_is_refused():
    from byteps.core import algorithms
    from byteps.core.collective import rules
    assert isinstance(algorithms.resolve(None, op=rules.ADASUM), algorithms.Adasum)
    assert isinstance(algorithms.resolve(None, op="adasum"), algorithms.Adasum)
    with pytest.raises(ValueError, match="op=Adasum is the Adasum algorithm, and "
                                         "algorithm=SyncPS is another"):
        algorithms.resolve(algorithms.SyncPS(), op=rules.ADASUM)
    with pytest.raises(ValueError, match="rule 'adasum-compression'"):
        algorithms.Adasum().bind({"compressor": "onebit", "ef": "vanilla"})
    for kind in ("reducescatter", "push_pull", "sparse_allreduce"):
        with pytest.raises(rules.UnsupportedOpError, match=f"op=Adasum is not supported for "
                                                           f"{kind}"):
            rules.resolve_op(None, rules.ADASUM, kind)
    assert rules.resolve_op(None, rules.ADASUM, "DistributedOptimizer") == (-1, False)


def test_tensorflow_refusals():
    tf = pytest.importorskip("tensorflow")
    import byteps.tensorflow as hvd
    from byteps.core import algorithms
    with pytest.raises(ValueError, match="rule 'adasum-v1-optimizer'"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                 op=hvd.Adasum)
    with pytest.raises(ValueError, match="rule 'adasum-tape'"):
        hvd.DistributedGradientTape(tf.GradientTape(), algorithm=algorithms.Adasum())
    with pytest.raises(ValueError, match="rule 'adasum-compression'"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum,
                                    compression=hvd.Compression.fp16)
    with pytest.raises(ValueError, match="op=Adasum is the Adasum algorithm, and "
                                         "algorithm=SyncPS is another"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum,
                                    algorithm=algorithms.SyncPS())

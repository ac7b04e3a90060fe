"""Issue 24: elastic workers composed with server replication and with peer algorithms.

Real jobs under ``bpslaunch --standalone --min-workers 2`` with a hard timeout
(tests/scripts/elastic_compose.py: full-batch least squares whose result does not depend
on the number of workers, so it must equal one process's run of the same steps):

* ``BYTEPS_SERVER_REPLICAS=1``: a worker is SIGKILLed at step 12 (the group re-forms, the
  servers' replication follows the new epoch), then a server at step 25 (its backup, with
  the copies of the new epoch, takes over); the job finishes with the exact result;
* ``Decentralized``: after a worker is lost the peers of the re-formed group (dense ranks,
  the new epoch's address book) go on averaging and finish with the exact result.
"""
import sys

import numpy as np
import pytest

from conftest import ROOT, SCRIPTS, assert_ok, read_results, run_job

sys.path.insert(0, str(ROOT / "benchmarks"))
from chaos_job import reference  # noqa: E402  (the elastic scripts' least squares, one process)

pytestmark = pytest.mark.timeout(200)
STEPS = 40


def _job(tmp_path, mode: str, worker_kill: int, server_kill: int, workers=3, **env):
    out = tmp_path / mode
    out.mkdir()
    res = run_job([sys.executable, str(SCRIPTS / "elastic_compose.py"), str(out), str(STEPS),
                   str(worker_kill), str(server_kill), mode], workers=workers, servers=2,
                  timeout=170, launcher_args=("--min-workers", "2"), BYTEPS_ENABLE_IPC=0,
                  BYTEPS_HEARTBEAT_INTERVAL=0.2, **env)
    return res, read_results(out)


def _check_exact(res, ranks, survivors: int):
    assert_ok(res)
    assert "ended with signal SIGKILL; the elastic job goes on with " \
           f"{survivors} worker(s)" in res.stderr, res.stderr[-3000:]
    assert sorted(ranks) == list(range(survivors)), res.stderr[-3000:]
    got = [np.array(ranks[r]["w"], np.float32) for r in sorted(ranks)]
    for r, g in enumerate(got):
        assert ranks[r]["size"] == survivors
        assert np.array_equal(g, got[0]), "ranks differ"
    np.testing.assert_allclose(got[0], reference(STEPS), rtol=1e-4, atol=1e-5)


def test_elastic_with_replicas_survives_a_worker_then_a_server(tmp_path):
    # 64-byte partitions: the 160-byte gradient has partitions on both servers
    res, ranks = _job(tmp_path, "sync", 12, 25, BYTEPS_SERVER_REPLICAS=1,
                      BYTEPS_PARTITION_BYTES=64)
    _check_exact(res, ranks, 2)
    assert "BYTEPS_SERVER_REPLICAS=1: its backup server takes over, the job goes on" \
        in res.stderr, res.stderr[-3000:]
    assert ranks[0].get("server_killed"), ranks[0]
    # the survivors restored the commit of step 10 and re-formed as ranks 0 and 1 of 2
    for r in (0, 1):
        assert ranks[r]["resets"] == [[10, r, 2]], ranks[r]["resets"]
    # the backup held copies of the re-formed group's rounds when its primary died
    assert "this server owns its keys now" in res.stderr, res.stderr[-3000:]


def test_decentralized_keeps_training_after_a_worker_is_lost(tmp_path):
    """Decentralized(peer_selection="all"): the last of 3 ranks dies before its step-12
    exchange; the two survivors (blocked on its model) restore the commit of step 10 and
    average with the peers of the re-formed group; the mean of the local steps is the
    full-batch step, so the result is one process's."""
    res, ranks = _job(tmp_path, "decentralized", 12, -1)
    _check_exact(res, ranks, 2)
    for r in (0, 1):
        assert ranks[r]["resets"] == [[10, r, 2]], ranks[r]["resets"]


def test_async_model_average_keeps_training_after_a_worker_is_lost(tmp_path):
    """AsyncModelAverage with onebit + error feedback: the last of 3 ranks dies at step
    12; the survivors' background round fails, the next step raises the membership change
    to bps.elastic.run, which restores a commit and re-forms; the averaging starts again in
    the group of 2 (its thread, its exact first average) and finish() leaves both equal.
    Before, the round's error came back wrapped as a plain failure and ended the job."""
    res, ranks = _job(tmp_path, "average", 12, -1)
    assert_ok(res)
    assert sorted(ranks) == [0, 1], res.stderr[-3000:]
    assert ranks[0]["w"] == ranks[1]["w"]
    for r in (0, 1):
        (step, rank, size), = ranks[r]["resets"]
        assert step % 5 == 0 and step >= 10 and (rank, size) == (r, 2), ranks[r]["resets"]
        assert ranks[r]["loss"] < 0.2 * ranks[r]["loss0"], ranks[r]


# ---------------------------------------------------------------------- over ssh (-H)
FAKE_SSH = """#!/bin/sh
# ssh [options] -- HOST COMMAND: run COMMAND here, as sshd would through the login shell
while [ "$1" != "--" ]; do shift; done
shift; shift
export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
exec sh -c "$*"
"""


def test_elastic_over_ssh_worker_lost_and_one_started_by_discovery(tmp_path):
    """-H a:2,b:2 --min-workers 2 through an ssh that runs the remote command here (the
    bootstrap protocol; tests/test_ssh.py runs real sshds as root): the last rank dies at
    step 20, the three survivors go on; at step 40 the discovery script lists 4 slots and
    bpslaunch starts a worker over ssh on the listed host, let in at the commit of step 45;
    the result equals one process's (tests/scripts/elastic_numpy.py)."""
    import os
    import subprocess
    from conftest import BPSLAUNCH, ROOT, job_env
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (out / "hosts").write_text("localhost:4\n")
    env = job_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", BYTEPS_ENABLE_IPC=0,
                  BYTEPS_HEARTBEAT_INTERVAL=0.2)
    res = subprocess.run(BPSLAUNCH + ["-H", "a:2,b:2", "--min-workers", "2", "--max-workers",
                                      "4", "--host-discovery-script", f"cat {out / 'hosts'}",
                                      "-x", "PYTHONPATH", sys.executable,
                                      str(SCRIPTS / "elastic_numpy.py"), str(out), "60", "20",
                                      "40"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=170,
                         check=False)
    assert_ok(res)
    assert "worker 3 on b" in res.stderr and "the elastic job goes on with 3 worker(s)" \
        in res.stderr, res.stderr[-3000:]
    assert "started worker on localhost (joined later)" in res.stderr, res.stderr[-3000:]
    ranks = read_results(out)
    assert sorted(ranks) == [0, 1, 2, 3], res.stderr[-3000:]
    for r in (0, 1, 2):
        assert ranks[r]["resets"] == [[20, r, 3], [45, r, 4]], ranks[r]["resets"]
    got = [np.array(ranks[r]["w"], np.float32) for r in range(4)]
    assert all(np.array_equal(g, got[0]) for g in got)
    np.testing.assert_allclose(got[0], reference(60), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- under Slurm
@pytest.mark.timeout(200)
def test_elastic_slurm_tasks_go_on_without_a_lost_one(tmp_path):
    """srun bpslaunch --slurm --min-workers 2 as 3 task processes (nodes 127.0.0.1-3, as
    tests/test_slurm.py): the last task's worker dies at step 12; the scheduler re-forms
    the group with the two alive, every task (that one too: its server served to the end)
    exits 0 and the result is one process's."""
    import subprocess
    from conftest import BPSLAUNCH, ROOT, job_env
    from byteps.launcher import free_port
    from test_slurm import srun_envs, wait_all
    out = tmp_path / "sync"
    out.mkdir()
    envs = srun_envs("127.0.0.[1-3]", 3, 1, free_port())
    procs = [subprocess.Popen(BPSLAUNCH + ["--slurm", "--min-workers", "2", sys.executable,
                                           str(SCRIPTS / "elastic_compose.py"), str(out),
                                           str(STEPS), "12", "-1", "sync"],
                              env=job_env(**e, BYTEPS_HEARTBEAT_INTERVAL=0.2), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for e in envs]
    outs = wait_all(procs, 170)
    text = "\n---\n".join(outs)
    assert "the elastic job goes on with 0 worker(s)" in outs[2], text[-4000:]
    ranks = read_results(out)
    assert sorted(ranks) == [0, 1], text[-4000:]
    got = [np.array(ranks[r]["w"], np.float32) for r in (0, 1)]
    assert np.array_equal(got[0], got[1]) and ranks[0]["size"] == 2
    np.testing.assert_allclose(got[0], reference(STEPS), rtol=1e-4, atol=1e-5)

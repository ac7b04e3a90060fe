"""The chaos harness on the emulated cluster (benchmarks/chaos_cluster.py): 4 workers and 2
servers, one network namespace per host, faults drawn from a seed, including a host's link
down (partition), a link slowed to 1/50 and a full /dev/shm.  Every run must survive with
the right parameters or end in bounded time with an error naming the fault; no hang, no
silent wrong result, no process or shared-memory file left.  Root only (namespaces, tc,
mount); long, so ``pytest -m chaos_full``."""
import os
import sys

import pytest
from conftest import ROOT
from test_chaos import _check

sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

pytestmark = [pytest.mark.chaos_full, pytest.mark.root, pytest.mark.timeout(1500),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")]


def test_new_fault_kinds_on_the_emulated_cluster(tmp_path):
    import chaos_cluster
    rc = chaos_cluster.main(["--faults", "6", "--seed", "2", "--max-freeze", "10", "--kinds",
                             "partition,slow-link,full-shm,kill-scheduler", "--out",
                             str(tmp_path)])
    runs = _check(tmp_path)
    assert rc == 0, runs
    assert {r["kind"] for r in runs} >= {"partition", "slow-link", "full-shm"}


def test_twenty_seeded_faults_on_the_emulated_cluster(tmp_path):
    import chaos_cluster
    rc = chaos_cluster.main(["--faults", "20", "--seed", "1", "--out", str(tmp_path)])
    _check(tmp_path)
    assert rc == 0

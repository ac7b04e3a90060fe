"""``byteps.run``: Horovod's ``horovod.run`` (byteps/launcher/pyrun.py), called as
Horovod's examples call it under ``--num-proc``: a function of ``__main__``, results
ordered by rank, a failed worker raising ``RuntimeError``, other machines refused."""
import json
import subprocess
import sys

import pytest
from conftest import SCRIPTS, job_env

pytestmark = pytest.mark.timeout(150)


def _main(*args: str) -> str:
    r = subprocess.run([sys.executable, str(SCRIPTS / "pyrun_main.py"), *args],
                       env=job_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.parametrize("pickler", ["cloudpickle", "pickle"])
def test_run_returns_every_ranks_result_in_rank_order(pickler):
    out = _main("ok", *([] if pickler == "cloudpickle" else ["pickle"]))
    line = next(t for t in out.splitlines() if t.startswith("RESULTS "))
    assert json.loads(line[8:]) == [[r, [12.0] * 3] for r in range(3)], out[-2000:]


def test_a_failed_worker_raises_runtime_error_naming_the_cause():
    out = _main("fail")
    assert "ERROR RuntimeError byteps.run: the job of 2 worker(s) failed" in out, out[-3000:]


def test_other_machines_are_refused_with_the_launcher_to_use():
    out = _main("far")
    assert "ERROR ValueError byteps.run starts the job on this machine; hosts " \
           "['gpu-box-7']" in out and "bpslaunch -H" in out, out


def test_a_function_that_never_joins_the_job_is_ordered_by_its_place():
    """A lambda (cloudpickle) that never calls init(): its results come back ordered by
    local rank, the place bpslaunch gave each worker."""
    code = ("import byteps, os\n"
            "print('R', byteps.run(lambda k: (k, os.environ['BYTEPS_LOCAL_RANK']), "
            "args=(7,), np=3))\n")
    r = subprocess.run([sys.executable, "-c", code], env=job_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "R [(7, '0'), (7, '1'), (7, '2')]" in r.stdout, r.stdout[-2000:]

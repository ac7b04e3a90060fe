"""Issue 16, items 1-6: bpslaunch's blame, flags, missing programs, config checks, help, tags.

Real processes through the installed ``bpslaunch`` script, each with a timeout.
"""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from conftest import BPSLAUNCH_CLI, ROOT, SCRIPTS, job_env, on_terminal

pytestmark = pytest.mark.timeout(120)
BPSLAUNCH = BPSLAUNCH_CLI
JOB = [sys.executable, str(SCRIPTS / "launcher_job.py")]


def launch(*args, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(BPSLAUNCH + [str(a) for a in args], env=job_env(**env), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bpslaunch timed out after {timeout} s\n{exc.stdout}\n{exc.stderr}")


def last_line(res) -> str:
    return res.stderr.strip().splitlines()[-1]


def job_pids(job_id: str) -> list[int]:
    tag = f"BYTEPS_JOB_ID={job_id}".encode()
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                found.append(int(d))
        except OSError:
            pass
    return found


# ------------------------------------------------------------------ 1. root cause
def test_root_cause_is_the_crashing_worker_not_a_server():
    # rank 1 raises at step 5 and needs 3 s to tear down: servers and the scheduler end
    # before it does, with the "another process failed" code
    res = launch("-np", 2, "--hosts", 2, "-s", 2, *JOB, "crash", 1, 5, timeout=90)
    assert res.returncode == 1, res.stderr[-3000:]
    last = last_line(res)
    assert last.startswith("bpslaunch: job failed; root cause: worker rank 1 "), res.stderr[-3000:]
    assert "exit code 1" in last and "RuntimeError: boom" in last, last
    assert "server" not in last.split(";")[1], last


def test_startup_timeout_blames_the_scheduler_with_its_reason():
    res = launch("-np", 2, "--hosts", 2, *JOB, "noinit", 1, BYTEPS_STARTUP_TIMEOUT=2,
                 timeout=90)
    assert res.returncode == 1, res.stderr[-3000:]
    last = last_line(res)
    assert last.startswith("bpslaunch: job failed; root cause: the scheduler (pid "), last
    assert "1 of 2 worker hosts registered" in last and "DMLC_NUM_WORKER=2" in last, last


# ------------------------------------------------------------------ 2. -n / -np
@pytest.mark.parametrize("flag", ["-n", "-np", "--num-workers"])
def test_num_workers_implies_standalone(flag):
    res = launch(flag, 2, *JOB, "hello")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(re.findall(r"hello from rank (\d) of (\d)", res.stdout)) == \
        [("0", "2"), ("1", "2")], res.stdout


def test_num_workers_with_a_role_is_refused_in_one_line():
    res = launch("-n", 2, *JOB, "hello", DMLC_ROLE="worker", timeout=30)
    assert res.returncode == 2
    assert "DMLC_ROLE=worker" in last_line(res) and "Traceback" not in res.stderr


# ------------------------------------------------------------------ 3. missing program
def test_missing_program_is_one_line_and_leaves_nothing(tmp_path):
    job = f"launchtest-{secrets.token_hex(4)}"
    res = launch("-np", 2, "-s", 2, "pyhton", "x.py", TMPDIR=tmp_path, BYTEPS_JOB_ID=job,
                 timeout=30)
    assert res.returncode == 127
    assert res.stderr.strip() == "bpslaunch: pyhton: command not found", res.stderr
    assert list(tmp_path.iterdir()) == [], "bpslaunch left its temp folder"
    assert job_pids(job) == [], "processes of the job are left"


def test_not_executable_program(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = launch("-np", 2, script, timeout=30)
    assert res.returncode == 126
    assert res.stderr.strip().splitlines() == [f"bpslaunch: {script}: permission denied (not an "
                                               f"executable file)"], res.stderr


# ------------------------------------------------------------------ 4. config, once
def test_bad_value_is_one_line_before_anything_starts():
    t0 = time.monotonic()
    res = launch("-np", 2, *JOB, "hello", BYTEPS_PARTITION_BYTES="4MB", timeout=30)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "bpslaunch: BYTEPS_PARTITION_BYTES='4MB' is invalid: not an integer "
        "(example: BYTEPS_PARTITION_BYTES=4096000)"], res.stderr
    assert time.monotonic() - t0 < 10


def test_rdma_is_a_clear_error():
    res = launch("-np", 2, *JOB, "hello", DMLC_ENABLE_RDMA=1, timeout=30)
    assert res.returncode == 2
    assert "RDMA is not available in this build; use tcp" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_name_warnings_once_per_job():
    res = launch("-np", 2, "-s", 2, *JOB, "hello", DMLC_NUM_WORKERS=2,
                 BYTEPS_PARTITON_BYTES=4096, BYTEPS_VISIBLE_CPU_CORES="0:1",
                 BYTEPS_CPU_BLACKLIST="3", BYTEPS_SERVER_MXNET_PATH="/opt/mxnet")
    assert res.returncode == 0, res.stderr[-3000:]
    err = res.stderr
    assert err.count("DMLC_NUM_WORKERS") == 1 and "did you mean DMLC_NUM_WORKER?" in err, err
    assert err.count("BYTEPS_PARTITON_BYTES") == 1, err
    assert "did you mean BYTEPS_PARTITION_BYTES?" in err, err
    notes = [ln for ln in err.splitlines() if "BYTEPS_VISIBLE_CPU_CORES" in ln]
    assert len(notes) == 1 and "does not need" in notes[0], err
    assert "BYTEPS_CPU_BLACKLIST" in notes[0] and "BYTEPS_SERVER_MXNET_PATH" in notes[0]
    assert "did you mean" not in notes[0]


def test_config_names_unit():
    from byteps.core.config import NAMES_CHECKED, Config, ConfigError, name_report
    unknown, original = name_report({"DMLC_NUM_WORKERS": "2", "BYTEPS_NUMA_ROOT_QUOTA": "2",
                                     "BYTEPS_MULTITHREADED_CPU": "1", "DMLC_ENABLE_RDMA": "0",
                                     "BYTEPS_DEBUG_SAMPLE_TENSOR": "7"})
    assert unknown == ["unknown DMLC variable DMLC_NUM_WORKERS is ignored; did you mean "
                       "DMLC_NUM_WORKER?"]
    assert original == ["BYTEPS_DEBUG_SAMPLE_TENSOR", "BYTEPS_MULTITHREADED_CPU",
                        "BYTEPS_NUMA_ROOT_QUOTA", "DMLC_ENABLE_RDMA"]
    with pytest.raises(ConfigError, match="UCX is not available"):
        Config.from_env({"DMLC_ENABLE_UCX": "1"})
    Config.from_env({"DMLC_ENABLE_RDMA": "0"})
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        Config.from_env({"BYTEPS_PARTITON_BYTES": "1", NAMES_CHECKED: "1"})
        assert got == []
        Config.from_env({"BYTEPS_PARTITON_BYTES": "1"})
        assert len(got) == 1 and "BYTEPS_PARTITION_BYTES" in str(got[0].message)


# ------------------------------------------------------------------ 5. help, version, usage
def test_help_lists_variables_with_the_configs_defaults():
    from byteps.core.config import Config
    res = launch("--help", timeout=30)
    assert res.returncode == 0
    rows = dict(re.findall(r"^  ((?:DMLC|BYTEPS)_[A-Z_]+) +\[([^\]]*)\]", res.stdout, re.M))
    for name in ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI",
                 "DMLC_PS_ROOT_PORT", "DMLC_WORKER_ID", "BYTEPS_PARTITION_BYTES",
                 "BYTEPS_LOG_LEVEL", "BYTEPS_HEARTBEAT_TIMEOUT", "BYTEPS_JOB_SECRET"):
        assert name in rows, res.stdout
    # the defaults shown are the ones a process really gets
    cfg = Config.from_env({}, warn_unknown=False)
    assert rows["BYTEPS_PARTITION_BYTES"] == str(cfg.partition_bytes)
    assert rows["BYTEPS_SCHEDULING_CREDIT"] == str(cfg.scheduling_credit)
    assert float(rows["BYTEPS_HEARTBEAT_TIMEOUT"]) == cfg.heartbeat_timeout
    assert float(rows["BYTEPS_STARTUP_TIMEOUT"]) == cfg.startup_timeout
    assert rows["BYTEPS_LOG_LEVEL"] == "WARNING" and rows["DMLC_ROLE"] == cfg.role
    assert rows["DMLC_NUM_WORKER"] == str(cfg.num_worker)


def test_help_defaults_match_a_default_process():
    from byteps.core.config import Config
    from byteps.launcher.envhelp import VARIABLES
    default = Config()
    real = Config.from_env({}, warn_unknown=False)
    for name, field, _, _ in VARIABLES:
        if field is not None and field not in ("role", "local_size"):
            assert getattr(real, field) == getattr(default, field), name


def test_version_and_plain_usage():
    from byteps import __version__
    res = launch("--version", timeout=30)
    assert res.returncode == 0 and __version__ in res.stdout and "byteps-ps" in res.stdout
    res = launch(timeout=30)
    assert res.returncode == 2
    assert res.stderr.startswith("usage: bpslaunch"), res.stderr
    assert "nothing to run" in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------------------------------ 6. tagged output
def test_tag_output_flags():
    res = launch("-np", 2, "--tag-output", *JOB, "hello")
    assert res.returncode == 0, res.stderr[-3000:]
    for r in (0, 1):
        assert f"[worker {r}] hello from rank {r} of 2" in res.stdout.splitlines(), res.stdout
        assert f"[worker {r}] stderr of rank {r}" in res.stderr.splitlines(), res.stderr


def test_whole_tagged_lines_through_a_pipe():
    """Two workers write 20 KB lines in 200 flushed pieces each, to stdout and stderr at
    once, into one pipe (``bpslaunch -np 2 ... 2>&1 | cat``): by default every line
    arrives whole behind its worker's tag (a pipe is tagged as a terminal is); with
    --no-tag-output whole and untagged."""
    for flags, tag in (((), "[worker {r}] "), (("--no-tag-output",), "")):
        p = subprocess.run(BPSLAUNCH + ["-np", "2", *flags, sys.executable,
                                        str(SCRIPTS / "long_lines.py")],
                           env=job_env(), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60, check=False)
        out = p.stdout.decode()
        assert p.returncode == 0, out[-3000:]
        lines = [ln for ln in out.splitlines() if "BEGIN" in ln or "END" in ln]
        assert len(lines) == 12, out[-3000:]
        for ln in lines:
            m = re.fullmatch(r"(\[worker (\d)\] )?BEGIN (\d) (\d) (\d+) END (\d) (\d)", ln)
            assert m, ln[:200] + " ... " + ln[-200:]
            r = m.group(3)
            assert ln.startswith(tag.format(r=r)) and m.group(5) == r * 20000, ln[:200]
            assert (m.group(6), m.group(7)) == (r, m.group(4))


# ------------------------------------------------------------------ 7. -np as in Horovod
def test_np_is_this_machine_with_local_ranks(tmp_path):
    """bpslaunch -np 3: one host of 3 workers, local ranks 0, 1, 2 and local size 3
    everywhere (LOCAL_RANK/LOCAL_WORLD_SIZE and BytePS's own); a trace run says where
    the timelines are."""
    res = launch("-np", 3, sys.executable, SCRIPTS / "rank_env.py", tmp_path, timeout=90,
                 BYTEPS_TRACE_ON=1, BYTEPS_TRACE_DIR=tmp_path / "tr")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "bpslaunch: timeline: " in res.stderr, res.stderr[-3000:]
    assert f" {tmp_path / 'tr'}/<rank>/comm.json" in res.stderr, res.stderr[-3000:]
    docs = {int(p.stem[4:]): __import__("json").loads(p.read_text())
            for p in tmp_path.glob("rank*.json")}
    assert sorted(docs) == [0, 1, 2]
    for rank, d in docs.items():
        assert (d["local_rank"], d["local_size"], d["size"]) == (rank, 3, 3), d
        assert d["env"]["LOCAL_RANK"] == str(rank) and d["env"]["LOCAL_WORLD_SIZE"] == "3"
        assert d["env"]["NODE_RANK"] == "0"


def test_np_with_hosts_infers_the_local_size():
    from byteps.launcher import layout
    assert layout(3, 0, 0) == (1, 3)                   # -np 3
    assert layout(2, 1, 0) == (1, 2)                   # -np 2 --hosts 1
    assert layout(4, 2, 0) == (2, 2) and layout(4, 0, 2) == (2, 2)
    assert layout(0, 2, 0) == (2, 1) and layout(0, 0, 0) == (1, 1)
    assert layout(4, 0, 0, elastic=True) == (4, 1)     # elastic: a host per worker
    with pytest.raises(SystemExit, match=r"--hosts can be 1, 2, 3 or 6 \(or -np a "
                                         r"multiple of 4\)"):
        layout(6, 4, 0)
    with pytest.raises(SystemExit, match="--local-size can be 1 or 5"):
        layout(5, 0, 2)
    res = launch("-np", 6, "--hosts", 4, "true", timeout=30)
    assert res.returncode != 0 and "--hosts can be 1, 2, 3 or 6" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_help_names_every_mode():
    res = launch("--help", timeout=30)
    assert res.returncode == 0
    assert "bpslaunch k8s" in res.stdout and "-H localhost:4" in res.stdout, res.stdout[:3000]


def test_tags_by_default_on_a_terminal():
    text = on_terminal(BPSLAUNCH + ["-np", "2", *JOB, "hello"], job_env()).replace("\r\n", "\n")
    for r in (0, 1):
        assert f"[worker {r}] hello from rank {r} of 2" in text, text

"""Autotune (byteps/core/autotune/): the plan and the pick are pure and deterministic;
in a real job every rank goes through the same settings at the same step boundaries and
cuts tensors alike (exact sums throughout); after the final choice the servers (and their
backups) hold only the chosen size's keys; workers started with different explicit
settings end the job at registration with the mismatch named, instead of hanging."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

from byteps.core import autotune
from byteps.core.engine.servers import COLOCATED_PARTITION_BYTES
from conftest import assert_ok, read_results, run_script

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from fail_cluster import Cluster  # noqa: E402


def _sums(nservers, bw, rtt, ranks=2, steps=3, step_bytes=100e6):
    """What ``ranks`` identical ranks would add up (see autotune.pack)."""
    busy = step_bytes / nservers / bw * steps
    summary = [(int(step_bytes / nservers * steps), busy, rtt)] * nservers
    return autotune.pack(summary, steps, int(step_bytes * steps)) * ranks


def test_window_is_the_bandwidth_delay_product_per_server():
    bw, rtt = 50e6, 0.02                     # per server: 1 MB in flight covers the round trip
    assert autotune.window(262144, [bw, bw], [rtt, rtt]) == 2 * (int(bw * rtt) + 2 * 262144)
    assert autotune.window(4 << 20, [bw, bw], [rtt, rtt]) == 2 * (int(bw * rtt) + (8 << 20))
    assert autotune.window(4 << 20, [bw], [0.0]) == 2 * (4 << 20)      # >= 2 partitions
    p = autotune.plan(_sums(2, bw, rtt), 2, 4096000, True, None, 1 << 30, 16384000)
    assert p.trials[0] == (4096000, 16384000)          # the initial setting is trial 0
    assert len(p.trials) == 1 + autotune.TRIALS
    assert p.bandwidth == pytest.approx(2 * bw) and p.rtt == pytest.approx(rtt)
    doubled = [(size, credit) for size, credit in p.trials[1:]
               if credit == 2 * autotune.window(size, [bw, bw], [rtt, rtt])]
    assert len(doubled) == 1             # the model's best size, also with twice its window
    best = doubled[0][0]
    assert (best, autotune.window(best, [bw, bw], [rtt, rtt])) in p.trials
    for size, credit in p.trials[1:]:
        assert (size, credit) in doubled or credit == autotune.window(size, [bw, bw], [rtt, rtt])
    # the same sums give the same plan (every rank decides alone, from the same numbers)
    again = autotune.plan(_sums(2, bw, rtt), 2, 4096000, True, None, 1 << 30, 16384000)
    assert again == p


def test_explicit_settings_win():
    s = _sums(2, 50e6, 0.02)
    p = autotune.plan(s, 2, 1024000, False, None, 1 << 30, 4096000)    # partition explicit
    assert {size for size, _ in p.trials} == {1024000}
    p = autotune.plan(s, 2, 4096000, True, 8, 1 << 30, 8 * 4096000)    # credit explicit
    assert all(credit == 8 * size for size, credit in p.trials)
    assert autotune.plan(s * 0, 2, 4096000, True, None, 1 << 30, 16384000) is None


def test_pick_keeps_the_initial_setting_unless_clearly_faster():
    assert autotune.pick(np.array([1.0, 0.97, 0.99])) == 0
    assert autotune.pick(np.array([1.0, 0.97, 0.80])) == 2


def test_probe_measures_rate_and_round_trip():
    pr = autotune.Probe(1)
    # 1 MB pushes at 100 MB/s with a 5 ms round trip, two in flight at a time
    t, rtt, bw, size = 0.0, 0.005, 100e6, 1 << 20
    for _ in range(10):
        pr.sent(0, size, t)
        pr.sent(0, size, t)
        pr.acked(0, size, t, t + rtt + size / bw)
        pr.acked(0, size, t, t + rtt + 2 * size / bw)
        t += rtt + 2 * size / bw
    (nbytes, busy, est), = pr.summary(t)
    assert nbytes == 20 * size
    assert nbytes / busy == pytest.approx(bw / (1 + rtt * bw / (2 * size)), rel=1e-6)
    # the rate seen includes the idle round trips, so the estimate lands below the truth
    assert 0.4 * rtt <= est <= rtt


def test_layout_key():
    assert autotune.layout_key(12345, 4096000, 4096000) == 12345
    k = autotune.layout_key(12345, 1 << 20, 4096000)
    assert k != 12345 and k == autotune.layout_key(12345, 1 << 20, 4096000) and k < 1 << 63


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replicas", [0, 1])
def test_every_rank_switches_alike_at_step_boundaries(tmp_path, replicas):
    res = run_script("autotune_job.py", tmp_path, 11, 16_000_000, workers=2, servers=2,
                     timeout=110, BYTEPS_AUTOTUNE_STEPS=1, BYTEPS_LOG_LEVEL="INFO",
                     BYTEPS_AUTOTUNE_LOG=str(tmp_path / "tune-{rank}.csv"),
                     BYTEPS_TEST_RECORD=str(tmp_path / "rec"),
                     BYTEPS_SERVER_REPLICAS=replicas)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: wrong sums at steps {doc['failures']}"
    # the same settings at the same steps on every rank, and the same cut every step
    assert out[0]["changes"] == out[1]["changes"], out
    assert out[0]["layouts"] == out[1]["layouts"]
    assert out[0]["choice"] == out[1]["choice"] and out[0]["choice"] is not None
    assert out[0]["hold"] == out[1]["hold"] and out[0]["state"] in ("verify", "done"), out
    changes = {step: size for step, size, _ in out[0]["changes"]}
    # every node on this machine: colocated partitions (engine.servers.colocated_config)
    initial = out[0]["initial"]
    assert initial == out[1]["initial"] == COLOCATED_PARTITION_BYTES, out
    assert any(size != initial for size in changes.values()), "no trial changed the size"
    # the cut changes only at the steps where a setting was applied (step s's pushes run
    # under the setting applied at the latest boundary <= s)
    size = initial
    for step, key, lengths in out[0]["layouts"]:
        size = changes.get(step, size)
        assert max(lengths) * 4 == min(size, 16_000_000) or len(lengths) == 1, (step, size)
        want = 0 if size == initial else 1
        assert (key != out[0]["base_key"]) == bool(want), (step, size, key)
    # the choice is recorded in the CSV and at INFO on both ranks
    for r in (0, 1):
        rows = (tmp_path / f"tune-{r}.csv").read_text().splitlines()
        assert rows[0].startswith("rank,step,kind") and any(",choice," in x for x in rows)
        assert any(",defer," in x for x in rows), rows
    assert res.stderr.count("bytes in flight") == 2, res.stderr[-3000:]
    _only_the_chosen_keys_are_held(tmp_path, out, replicas, res)


def _only_the_chosen_keys_are_held(tmp_path, out, replicas, res):
    """After the final choice every worker asked the servers to free the keys of the other
    sizes: each server (and, with replicas, each backup's copies) ends holding only the
    big tensor's final key, as its exit record says; no shared-memory file of an old key
    is left while the job still runs."""
    final = out[0]["layouts"][-1][1]
    old = {key for _, key, _ in out[0]["layouts"]} - {final}
    assert old, out[0]["layouts"]
    for r, doc in out.items():
        assert doc["retired"] == len(old), (r, doc["retired"], old)
        left = [f for f in doc["shm_files"] if any(f"-{k:x}-" in f for k in old)]
        assert not left, (r, left)
    servers = [json.loads(p.read_text()) for p in tmp_path.glob("rec.bytes.*.json")]
    assert len(servers) == 2, res.stderr[-3000:]
    for s in servers:
        held = {k for k, name in s["keys"] if name == "autotune.big"}
        assert held == {final}, (held, final, old, res.stderr[-3000:])
        # every old key had partitions (and, with replicas, copies) on both servers
        assert s["keys_freed"] == len(old) and s["free_refused"] == 0, s
        assert (s["replica_stored"] > 0) == bool(replicas), s
    assert res.stderr.count("key(s) no worker uses any more") >= 2, res.stderr[-3000:]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("env1,text", [
    ({"BYTEPS_PARTITION_BYTES": "1024000"}, "BYTEPS_PARTITION_BYTES=1024000"),
    ({"BYTEPS_AUTOTUNE": "0"}, "BYTEPS_AUTOTUNE=0"),
])
def test_different_explicit_settings_end_the_job_at_registration(tmp_path, env1, text):
    c = Cluster(tmp_path, workers=2, servers=1, args=(5,), worker_env={1: env1})
    try:
        t0 = time.monotonic()
        c.start()
        rcs = c.wait(40)
        took = time.monotonic() - t0
        assert all(rc not in (0, None) for rc in rcs.values()), f"{rcs}\n{c.logs()}"
        assert took < 30, f"took {took:.1f} s\n{c.logs()}"
        logs = c.logs()
        assert "settings mismatch" in logs and text in logs, logs[-4000:]
        assert "BYTEPS_PARTITION_BYTES=4096" in logs, logs[-4000:]
        assert "settings mismatch" in c.log("scheduler")
    finally:
        c.close()


def test_settings_sent_at_registration():
    from byteps.common.config import Config
    env = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9000"}
    assert autotune.settings(Config.from_env(env)) == [1, 0, 0]
    cfg = Config.from_env(dict(env, BYTEPS_PARTITION_BYTES="4096000",
                               BYTEPS_SCHEDULING_CREDIT="4", BYTEPS_AUTOTUNE="0"))
    assert autotune.settings(cfg) == [0, 4096000, 4]
    assert json.loads(json.dumps(autotune.settings(cfg))) == [0, 4096000, 4]


class _Engine:
    """What the Tuner uses of an engine in its overlap trial (no sockets)."""

    def __init__(self, cfg):
        self.cfg, self.probe, self.submitted = cfg, None, []

    def submit(self, tasks):
        self.submitted.extend(tasks)


def _defer_trial(sent_s: float, held_s: float):
    """Drive a Tuner through its overlap trial (step 5) with fixed step times; returns the
    hold flag seen in each step and the tuner."""
    from byteps.common.config import Config
    env = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9000", "DMLC_ROLE": "worker"}
    cfg = Config.from_env(env)
    tuner = autotune.Tuner(cfg, 0, 1, _Engine(cfg), True)
    tuner.plan = autotune.Plan(trials=((cfg.partition_bytes, cfg.credit_bytes),),
                               bandwidth=1e8, rtt=1e-3, step_bytes=1e6, predicted=())
    tuner.finish(0, 10, [1.0])             # the final choice: the overlap trial starts held
    seen, n = [], 10
    while tuner.state == "defer":
        hold = tuner.hold
        seen.append(hold)
        assert tuner.defer(["task"]) is hold          # held tasks wait for the next wait
        tuner.release()
        n += 1
        tuner.t_step = time.monotonic() - (held_s if hold else sent_s)   # this step's time
        tuner.at_step(n, lambda arr, name: arr * 2)       # two identical ranks
    return seen, tuner


@pytest.mark.parametrize("sent_s,held_s,hold", [(1.0, 1.0, True), (0.97, 1.0, True),
                                                 (0.9, 1.0, False), (1.2, 1.0, True)])
def test_overlap_trial_alternates_and_overlap_must_win_clearly(sent_s, held_s, hold):
    seen, tuner = _defer_trial(sent_s, held_s)
    k = tuner.k
    # held and sent at once alternate step by step (both see the same machine), k of each
    assert seen == [True, False] * k
    assert tuner.state == "verify" and tuner.hold is hold
    assert len(tuner.held_t) == len(tuner.sent_t) == k
    assert tuner.engine.submitted == ["task"] * k       # what was held was sent at the wait

"""Where autotune starts (byteps/core/autotune/initial.py, names.py): the probe at
init() gives every rank the same first setting, chosen from what it measured; a loop that
never calls step_done() gets its steps from repeated push_pull names, the same on every
rank, so autotune tunes it too (every rank switching settings at the same step)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from byteps.common.config import Config
from byteps.core import autotune
from byteps.core.autotune import initial
from byteps.core.autotune.names import NameSteps
from byteps.core.timeline import StepCounter
from conftest import assert_ok, read_results, run_script


def _ends(names, order):
    """The pushes (indices) at which ``names`` ends a step, pushing ``order``."""
    return [i for i, n in enumerate(order) if names.pushed(n)]


def test_a_step_ends_where_a_name_repeats_whatever_the_order():
    a, b = NameSteps(), NameSteps()
    # two ranks push the same names per step in different orders: the same boundaries,
    # reported from the first step that repeats the one before it (a steady loop)
    assert _ends(a, ["x", "y", "z"] * 4) == _ends(b, ["z", "x", "y"] * 4) == [6, 9]
    assert a.count == b.count == 2
    # a step unlike the one before it is not reported (nor the next one)
    assert _ends(NameSteps(), ["x", "y", "x", "y", "z", "x", "y", "z", "x"]) == [8]
    # a name pushed again while something is in flight (e.g. twice at once: an error)
    # ends no step; the next idle repeat does
    def run(last_idle):
        e = NameSteps()
        return [e.pushed(n, i) for n, i in [("x", 1), ("y", 1), ("x", 1), ("y", 1),
                                            ("x", last_idle)]]
    assert run(True) == [False] * 4 + [True] and run(False) == [False] * 5
    # autotune's own push_pulls never count, not even repeated
    c = NameSteps()
    assert _ends(c, ["x", autotune.NAME + ".plan", autotune.NAME + ".plan", "y"]) == []
    # a background thread's pushes (a stage's own timing, different on every rank) neither
    # end a step nor count as the step's names
    d, got = NameSteps(), []
    th = threading.Thread(target=lambda: got.extend(_ends(d, ["x", "x", "y", "x"])))
    th.start()
    th.join()
    assert got == [] and _ends(d, ["x", "y", "x", "y", "x"]) == [4]
    # after an explicit step_done the marks are the steps
    c.explicit = True
    assert _ends(c, ["x", "x", "x"]) == []


def test_only_the_loops_own_push_pulls_in_flight_hide_a_step_end():
    """Idle (an inferred step end, numpy's implicit step) means none of the main thread's
    push_pulls is in flight.  Whether autotune's exchange from the last step end is still
    in flight differs from rank to rank (its result comes once the slowest rank pushed
    it): counted, it once let one rank skip a step end the others took, and the job hung
    (3 ranks under load: 7 of 30 jobs hung or tuned differently; none after)."""
    steps, handles = StepCounter(), {}

    def push(hid):
        steps.track(hid, handles)
        handles[hid] = object()
    push(1)
    push(2)
    assert steps.busy(handles)
    del handles[1], handles[2]             # synchronized
    th = threading.Thread(target=push, args=(3,))     # autotune's exchange, say
    th.start()
    th.join()
    assert 3 in handles and not steps.busy(handles)
    push(4)
    assert steps.busy(handles)            # the loop's own push_pull in flight
    got = []                               # read from another thread: the same answer
    th = threading.Thread(target=lambda: got.append(steps.busy(handles)))
    th.start()
    th.join()
    assert got == [True]
    del handles[4]
    assert not steps.busy(handles) and not steps.mine
    for h in range(5, 500):                # a loop that never waits: forgotten as it goes
        push(h)
        del handles[h]
    assert len(steps.mine) < 130


def _probe_sums(nservers, bw_per_server, rtt, ranks=4):
    row = autotune.pack([(int(bw_per_server * 0.01), 0.01, rtt)] * nservers, 1, 1 << 20)
    return row * ranks


def test_the_probe_picks_the_models_size_and_its_window():
    cfg = Config.from_env({})
    # 4 servers at 1 Gbit/s per worker link (31 MB/s each): 512 KB partitions (the
    # emulated cluster's fastest: the servers' lag grows with the full partition), the
    # window of 512 KB partitions; 2 servers lag half as much: 1 MB
    sums = _probe_sums(4, 125e6 / 4, 1e-3)
    part, credit = initial.choose(sums, 4, cfg, cfg.partition_size())
    bw_s, rtt_s = autotune.rates(sums, 4)
    assert part == 512 << 10 and credit == autotune.window(part, bw_s, rtt_s)
    assert initial.choose(_probe_sums(2, 125e6 / 2, 1e-3), 2, cfg, cfg.partition_size())[0] \
        == 1 << 20
    # a slower link: smaller partitions; the same sums give the same answer (pure)
    slow = initial.choose(_probe_sums(4, 25e6 / 4, 1e-3), 4, cfg, cfg.partition_size())
    assert slow[0] < part
    assert initial.choose(sums, 4, cfg, cfg.partition_size()) == (part, credit)
    # nothing measured: keep the defaults
    assert initial.choose(np.zeros_like(sums), 4, cfg, cfg.partition_size()) is None
    # explicit settings win
    fixed = Config.from_env({"BYTEPS_PARTITION_BYTES": "4096000"})
    assert initial.choose(sums, 4, fixed, fixed.partition_size())[0] == 4096000
    credit4 = Config.from_env({"BYTEPS_SCHEDULING_CREDIT": "3"})
    p, c = initial.choose(sums, 4, credit4, credit4.partition_size())
    assert c == 3 * p


@pytest.mark.timeout(90)
def test_a_loop_without_step_marks_is_probed_and_tuned_alike_on_every_rank(tmp_path):
    steps = 14
    # BYTEPS_ENABLE_IPC=0: loopback without shared memory, like separate hosts (the probe
    # runs; one machine's shared-memory partitions are measured separately)
    res = run_script("autotune_infer_job.py", tmp_path, steps, 8_000_000, workers=2,
                     servers=2, timeout=80, BYTEPS_AUTOTUNE_STEPS=1, BYTEPS_ENABLE_IPC=0,
                     BYTEPS_LOG_LEVEL="INFO")
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1], res.stderr[-3000:]
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: wrong sums at steps {doc['failures']}"
        # the probe ran at init and set autotune's starting point
        assert len(doc["probe"]["rows"]) == 1, doc["probe"]
        _, _, _, part, credit, *_ = doc["probe"]["rows"][0]
        assert (part, credit) == (doc["probe"]["initial"], doc["probe"]["credit"])
        assert part in autotune.CANDIDATES, part
        # every step from the 3rd on began with a step end (the 2nd repeated the 1st)
        assert doc["inferred"] == doc["step"] == steps - 2 and not doc["explicit"], doc
        assert doc["choice"] is not None and doc["state"] in ("verify", "done"), doc
    # the same starting point, the same settings at the same steps, the same cuts
    assert out[0]["probe"] == {**out[1]["probe"], "rows": out[0]["probe"]["rows"]}
    assert out[0]["probe"]["rows"][0][3:5] == out[1]["probe"]["rows"][0][3:5]
    assert out[0]["changes"] and out[0]["changes"] == out[1]["changes"], out
    assert out[0]["cuts"] == out[1]["cuts"]
    assert res.stderr.count("starting with partitions of") == 2, res.stderr[-3000:]


@pytest.mark.timeout(60)
def test_a_step_end_one_rank_reaches_before_a_barrier_waits_for_nobody(tmp_path):
    """Rank 0 pushes a name again before a barrier, rank 1 after it (as in Horovod's
    duplicate-name test): both end an inferred step there, at different points of the
    program; autotune's exchange runs beside the program (steps.py), so nothing waits for
    the collective timeout and every sum stays right."""
    res = run_script("autotune_infer_job.py", tmp_path, 6, 400_000, "skew", workers=2,
                     servers=1, timeout=50, BYTEPS_AUTOTUNE_STEPS=1, BYTEPS_ENABLE_IPC=0,
                     BYTEPS_COLLECTIVE_TIMEOUT_S=30)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == [0, 1]
    for doc in out.values():
        assert doc["failures"] == [] and doc["inferred"] >= 4, doc
    assert out[0]["changes"] == out[1]["changes"] and out[0]["step"] == out[1]["step"]

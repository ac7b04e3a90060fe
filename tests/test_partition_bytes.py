"""BYTEPS_PARTITION_BYTES: every value the original BytePS accepts (its tests/test_mxnet.py
sets 2147483647); a partition larger than a tensor means no partitioning, and partitions
are capped only where one message could not carry them (BYTEPS_MAX_MSG_BYTES)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import assert_ok, read_results, run_script

from byteps.core import config as config_mod
from byteps.core.api import Tensor
from byteps.core.config import Config, ConfigError

ENV = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
       "DMLC_PS_ROOT_PORT": "9000"}


@pytest.mark.parametrize("raw", ["1", "8", "64", "4096000", "1073741824", "2147483647",
                                 "9223372036854775807"])
def test_every_positive_value_is_accepted(raw):
    assert Config.from_env(dict(ENV, BYTEPS_PARTITION_BYTES=raw)).partition_bytes == int(raw)


@pytest.mark.parametrize("raw,why", [("0", "must be >= 1"), ("-5", "must be >= 1"),
                                     ("4MB", "not an integer")])
def test_nonsense_is_still_refused(raw, why):
    with pytest.raises(ConfigError, match=f"BYTEPS_PARTITION_BYTES='{raw}' is invalid: {why}"):
        Config.from_env(dict(ENV, BYTEPS_PARTITION_BYTES=raw))


def test_larger_than_a_tensor_means_one_partition_and_no_warning(caplog, monkeypatch):
    monkeypatch.setattr(config_mod, "_PARTITION_WARNED", [])
    cfg = Config.from_env(dict(ENV, BYTEPS_PARTITION_BYTES="2147483647"))
    arr = np.zeros(5 << 20, np.float32)                    # 20 MiB
    with caplog.at_level(logging.WARNING, "byteps.config"):
        t = Tensor("w", arr, cfg.partition_size(arr.nbytes, "w"), 2)
    assert [(s, n) for _, s, n, _ in t.parts] == [(0, arr.size)]
    assert caplog.records == []
    assert cfg.credit_bytes == 4 * cfg.partition_size() < 8 << 30   # capped, not 4 x 2 GiB


def test_capped_where_one_message_cannot_carry_it(caplog, monkeypatch):
    monkeypatch.setattr(config_mod, "_PARTITION_WARNED", [])
    cfg = Config.from_env(dict(ENV, BYTEPS_PARTITION_BYTES="2147483647",
                               BYTEPS_MAX_MSG_BYTES=str(1 << 20)))
    cap = cfg.partition_size()
    assert cap == (1 << 20) - 4096 and cap % 8 == 0
    with caplog.at_level(logging.WARNING, "byteps.config"):
        assert cfg.partition_size(1000, "small") == cap          # no cut: no warning
        assert caplog.records == []
        arr = np.zeros(1 << 20, np.float32)                     # 4 MiB
        t = Tensor("big", arr, cfg.partition_size(arr.nbytes, "big"), 1)
        cfg.partition_size(arr.nbytes, "big2")
    assert len(t.parts) == 5 and max(n for _, _, n, _ in t.parts) * 4 <= cap
    assert len(caplog.records) == 1
    msg = caplog.records[0].getMessage()
    assert "tensor 'big'" in msg and "BYTEPS_MAX_MSG_BYTES=1048576" in msg
    # a value below the cap is used as it is
    assert Config.from_env(dict(ENV, BYTEPS_PARTITION_BYTES="8")).partition_size(1 << 30) == 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts,local,env", [
    (2, 1, {}),
    (2, 2, {}),                                            # local reduction: one chunk each
    (1, 2, {"BYTEPS_MAX_MSG_BYTES": 2 << 20}),             # capped at ~2 MiB partitions
    (2, 1, {"BYTEPS_MAX_MSG_BYTES": 2 << 20}),
], ids=["2x1", "2x2-local", "1x2-capped", "2x1-capped"])
def test_jobs_with_the_originals_partition_size(tmp_path, hosts, local, env):
    """BYTEPS_PARTITION_BYTES=2147483647 (the original's test_mxnet.py): exact sums."""
    res = run_script("local_small_shm.py", tmp_path, 2, 8, workers=hosts * local, servers=2,
                     timeout=240, launcher_args=("--hosts", str(hosts), "--local-size",
                                                 str(local)),
                     BYTEPS_PARTITION_BYTES=2147483647, **env)
    assert_ok(res)
    out = read_results(tmp_path)
    assert sorted(out) == list(range(hosts * local))
    for r, doc in out.items():
        assert doc["failures"] == [], f"rank {r}: {json.dumps(doc)[:2000]}"
    warned = res.stderr.count("is cut into partitions of")
    assert warned == (hosts * local if env and hosts > 1 else 0), res.stderr[-3000:]

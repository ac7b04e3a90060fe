"""Pure-logic tests: configuration validation and wire-format validation (no sockets)."""
import msgpack
import numpy as np
import pytest

from byteps.core.api import Tensor, tensor_key
from byteps.core.config import Config, ConfigError
from byteps.transport import TransportError, backend_for
from byteps.transport.wire import (ACK, PROTOCOL_VERSION, PULL, PUSH, SHM, Op, WireError,
                                   decode, encode, entry_array, payload_count)

V = PROTOCOL_VERSION

CLUSTER = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
           "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
           "BYTEPS_JOB_SECRET": "s3cret"}


def test_no_dmlc_means_local_single_process():
    cfg = Config.from_env({})
    assert not cfg.distributed and cfg.partition_bytes == 4096000
    assert cfg.server_engine_threads == 4


def test_cluster_config_parses_every_variable():
    cfg = Config.from_env(dict(CLUSTER, DMLC_WORKER_ID="1", BYTEPS_LOCAL_SIZE="4",
                               BYTEPS_LOCAL_RANK="3", BYTEPS_PARTITION_BYTES="1024000",
                               BYTEPS_SCHEDULING_CREDIT="2", BYTEPS_ENABLE_ASYNC="1",
                               BYTEPS_SERVER_ENGINE_THREAD="8", BYTEPS_LOG_LEVEL="debug"))
    assert cfg.distributed and cfg.num_worker == 2 and cfg.worker_id == 1
    assert (cfg.local_rank, cfg.local_size) == (3, 4)
    assert cfg.credit_bytes == 2 * 1024000 and cfg.enable_async
    assert cfg.server_engine_threads == 8


@pytest.mark.parametrize("name,value,needle", [
    ("DMLC_NUM_WORKER", "two", "DMLC_NUM_WORKER='two' is invalid: not an integer"),
    ("DMLC_PS_ROOT_PORT", "70000", "must be <= 65535"),
    ("DMLC_ROLE", "boss", "must be one of worker, server, scheduler"),
    ("BYTEPS_ENABLE_ASYNC", "maybe", "expected 0 or 1"),
    ("BYTEPS_PARTITION_BYTES", "-5", "must be >= 1"),
    ("DMLC_WORKER_ID", "2", "must be < DMLC_NUM_WORKER=2"),
])
def test_malformed_values_name_variable_value_and_example(name, value, needle):
    with pytest.raises(ConfigError) as ei:
        Config.from_env(dict(CLUSTER, **{name: value}))
    assert needle in str(ei.value) and "example" in str(ei.value)


def test_missing_variable_is_named():
    env = dict(CLUSTER)
    del env["DMLC_NUM_SERVER"]
    with pytest.raises(ConfigError, match="DMLC_NUM_SERVER is not set.*example: DMLC_NUM_SERVER=2"):
        Config.from_env(env)


def test_unknown_byteps_variable_warns_with_suggestion():
    with pytest.warns(UserWarning, match="BYTEPS_PARTITON_BYTES.*did you mean BYTEPS_PARTITION_BYTES"):
        Config.from_env({"BYTEPS_PARTITON_BYTES": "1"})


def test_transport_scheme_registry():
    assert backend_for("tcp://1.2.3.4:5") is backend_for("ipc:///tmp/x")
    with pytest.raises(TransportError, match="unknown transport scheme 'udp'.*known: ipc, rdma, tcp"):
        backend_for("udp://x:1")
    with pytest.raises(TransportError, match="no scheme"):
        backend_for("1.2.3.4:5")


def test_keys_come_from_names_and_partitions_cover_tensor():
    assert tensor_key("a") == tensor_key("a") != tensor_key("b")
    t = Tensor("w", np.zeros(2500, np.float32), 4000, 3)
    assert [p[2] for p in t.parts] == [1000, 1000, 500]
    assert sum(p[2] for p in t.parts) == 2500
    assert {p[3] for p in t.parts} == {0, 1, 2}          # spread over the servers


def roundtrip(body, op=Op.DATA, secret=None, **kw):
    frames = encode("job", 3, op, 1, 7, body, secret)
    return decode(frames, "job", secret, **kw)


def test_valid_data_message_roundtrip():
    hdr, rest = roundtrip([[[5, 0, 2, PUSH | PULL, 0, 4]], [[5, "w", [4], 0, 1, []]]])
    assert hdr.op == Op.DATA and hdr.sender == 3 and hdr.body[0][0][0] == 5
    assert payload_count(hdr.body[0], Op.DATA) == 1
    assert payload_count([[5, 0, 2, PUSH | PULL | SHM, 0, 4]], Op.DATA) == 0
    assert payload_count([[5, 0, 2, ACK, 0, 4], [5, 1, 2, PULL, 0, 4]], Op.RESULT) == 1
    arr = entry_array([5, 0, 2, PUSH, 0, 4], np.arange(4, dtype=np.float32).tobytes())
    assert arr.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("frames,needle", [
    ([b"x"], "expected header \\+ mac"),
    ([b"\xc1", b""], "not valid msgpack"),
    ([msgpack.packb([V, 2, 3]), b""], "7-element"),
    ([msgpack.packb([99, "job", 1, 20, 0, 1, [[], []]]), b""], "protocol version 99"),
    ([msgpack.packb([V, "other", 1, 20, 0, 1, [[], []]]), b""], "job id 'other'"),
    ([msgpack.packb([V, "job", 1, 77, 0, 1, {}]), b""], "unknown op 77"),
    ([msgpack.packb([V, "job", 1, 20, 0, 1, [[[1, 2, 3]], []]]), b""], "6 integers"),
    ([msgpack.packb([V, "job", 1, 20, 0, 1, [[[1, 0, 0, 1, 99, 4]], []]]), b""],
     "out of range"),
    ([msgpack.packb([V, "job", 1, 20, 0, 1, [[[1, 0, 0, 1 | 128, 0, 4]], []]]), b""],
     "NONFINITE without COMP"),
    ([msgpack.packb([V, "job", 1, 20, 0, 1, [[[1, 0, 0, 256, 0, 4]], []]]), b""],
     "out of range"),
    ([msgpack.packb([V, "job", 1, 20, 0, 1, [[], [["x"]]]]), b""], "bad declaration"),
    ([msgpack.packb([V, "job", 1, 1, 0, 1, [1]]), b""], "body must be a map"),
    ([b"\x00" * (2 << 20), b""], "exceeds"),
])
def test_malformed_headers_raise_wire_error(frames, needle):
    with pytest.raises(WireError, match=needle):
        decode(frames, "job", None)


def test_mac_is_checked_before_parsing():
    frames = encode("job", 1, Op.HEARTBEAT, 0, 1, {}, b"key")
    assert decode(frames, "job", b"key")[0].op == Op.HEARTBEAT
    with pytest.raises(WireError, match="credential"):
        decode(frames, "job", b"other")
    with pytest.raises(WireError, match="credential"):
        decode([b"\xc1", b""], "job", b"key")      # garbage never reaches msgpack


def test_truncated_payload_is_rejected():
    with pytest.raises(WireError, match="payload of 5 bytes"):
        entry_array([1, 0, 0, PUSH, 0, 100], b"short")


def test_scheduler_listen_address():
    from byteps.scheduler import _bind_host
    assert _bind_host("127.0.0.1") == "127.0.0.1"
    assert _bind_host("localhost") == "127.0.0.1"
    assert _bind_host("10.1.2.3") == "10.1.2.3"


def test_server_engine_threads_follow_the_cpus_unless_set(monkeypatch):
    import os

    from byteps.server.decls import engine_threads
    cfg = Config.from_env({})
    assert not cfg.engine_threads_explicit
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert engine_threads(cfg) == 0            # two CPUs: every partition summed inline
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert engine_threads(cfg) == 4
    cfg = Config.from_env({"BYTEPS_SERVER_ENGINE_THREAD": "3"})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cfg.engine_threads_explicit and engine_threads(cfg) == 3
    assert engine_threads(Config.from_env({"BYTEPS_SERVER_ENGINE_THREAD": "0"})) == 0

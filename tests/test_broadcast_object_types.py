"""broadcast_object of what Horovod scripts broadcast: argparse.Namespace, dataclasses and
nested containers of plain values, numpy arrays and torch tensors, through the real codec
and a local job (numpy and torch plugins); the decoder's field-by-field validation.  The
same objects across 2 workers: tests/test_user_day_one.py."""
from __future__ import annotations

import argparse
import dataclasses
import os

import msgpack
import numpy as np
import pytest

from byteps.core.collective import codec

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass
class Hyper:
    lr: float
    layers: tuple
    weights: np.ndarray
    name: str = "net"


@dataclasses.dataclass(frozen=True)
class Frozen:
    seed: int
    tags: list


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", default="/data")
    p.add_argument("--fp16", action="store_true")
    return p.parse_args(["--lr", "0.5"])


@pytest.fixture
def local_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("DMLC_", "BYTEPS_")):
            monkeypatch.delenv(k)


def _check_common(got, sent):
    assert isinstance(got["args"], argparse.Namespace) and vars(got["args"]) == vars(sent["args"])
    h = got["hyper"]
    assert type(h) is Hyper and h.lr == 0.25 and h.layers == (64, 32) and h.name == "net"
    assert h.weights.dtype == np.float32 and h.weights.tolist() == [[0, 1], [2, 3]]
    assert type(got["frozen"]) is Frozen and got["frozen"] == Frozen(7, ["a", (1, 2)])
    assert got["nested"] == {"a": [1, (2.5, None)], 3: b"x"}
    assert got["scalar"].dtype == np.int16 and got["scalar"] == 5


def _obj() -> dict:
    return {"args": _args(),
            "hyper": Hyper(0.25, (64, 32), np.arange(4, dtype=np.float32).reshape(2, 2)),
            "frozen": Frozen(7, ["a", (1, 2)]),
            "nested": {"a": [1, (2.5, None)], 3: b"x"}, "scalar": np.int16(5)}


def test_numpy_plugin_broadcasts_namespace_dataclass_nested(local_env):
    import byteps.numpy as bps
    bps.init()
    try:
        sent = _obj()
        _check_common(bps.broadcast_object(sent, root_rank=0), sent)
        assert vars(bps.broadcast_object(_args())) == vars(_args())   # hvd-style `args = ...`
        got = bps.allgather_object(_obj()["hyper"])
        assert len(got) == 1 and type(got[0]) is Hyper
        with pytest.raises(TypeError, match=r"obj\['a'\]\.x of type builtins\.range.*"
                                            r"vars\(obj\), dataclasses\.asdict"):
            bps.broadcast_object({"a": argparse.Namespace(x=range(3))})
        with pytest.raises(TypeError, match="defined inside a function"):
            @dataclasses.dataclass
            class Local:
                x: int
            bps.broadcast_object(Local(1))
    finally:
        bps.shutdown()


def test_torch_plugin_broadcasts_tensors_inside_namespace_and_dataclass(local_env):
    torch = pytest.importorskip("torch")
    import byteps.torch as bps
    bps.init()
    try:
        sent = _obj()
        sent["args"].init = torch.arange(3, dtype=torch.bfloat16)
        sent["hyper"].weights = np.arange(4, dtype=np.float32).reshape(2, 2)
        sent["t"] = [Frozen(1, [torch.ones(2, 2)])]
        got = bps.broadcast_object(sent, root_rank=0)
        assert got["args"].init.dtype == torch.bfloat16 and got["args"].init.tolist() == [0, 1, 2]
        assert type(got["t"][0]) is Frozen and torch.equal(got["t"][0].tags[0], torch.ones(2, 2))
        del sent["args"].init, got["args"].init
        _check_common(got, sent)
    finally:
        bps.shutdown()


def test_decoder_validates_records_and_never_imports():
    good = codec.encode(Hyper(1.0, (1,), np.zeros(1, np.float32)))
    assert type(codec.decode(good)) is Hyper
    with pytest.raises(ValueError):
        codec.decode(good[:-2])

    def record(module, qual, fields):
        return msgpack.packb(msgpack.ExtType(codec.EXT_DATACLASS, codec.pack(
            [module, qual, fields])), use_bin_type=True)
    # a class that is not loaded here: refused with the fix, nothing imported
    with pytest.raises(ValueError, match="not defined in this process.*asdict"):
        codec.decode(record("json.decoder", "NotThere", {}))
    assert "antigravity" not in __import__("sys").modules
    with pytest.raises(ValueError, match="not defined"):
        codec.decode(record("antigravity", "X", {}))
    assert "antigravity" not in __import__("sys").modules
    # not a dataclass (a plain class that exists), bad names, fields that differ
    with pytest.raises(ValueError, match="not defined"):
        codec.decode(record("argparse", "ArgumentParser", {}))
    with pytest.raises(ValueError, match="bad class name"):
        codec.decode(record(__name__, "Hyper;rm", {}))
    with pytest.raises(ValueError, match="has fields"):
        codec.decode(record(__name__, "Frozen", {"seed": 1}))
    bad_ns = msgpack.packb(msgpack.ExtType(codec.EXT_NAMESPACE, codec.pack([1, 2])))
    with pytest.raises(ValueError, match="Namespace"):
        codec.decode(bad_ns)
    bad_arr = msgpack.packb(msgpack.ExtType(codec.EXT_NDARRAY, codec.pack(["|O", [1], b"0"])))
    with pytest.raises(ValueError, match="not allowed|bad dtype"):
        codec.decode(bad_arr)

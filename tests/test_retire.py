"""Keys autotune no longer uses, freed (byteps/core/autotune/retire.py, byteps/server/retire.py,
``wire.free_body``), step by step without sockets: which keys a worker hands over after
the final choice (never a key still in use, never the final one), and when a server frees
one (every pushing rank asked, no round in flight).  The real multi-process job is
tests/test_autotune.py::test_every_rank_switches_alike_at_step_boundaries."""
from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from byteps import transport
from byteps.common.config import Config
from byteps.core import autotune
from byteps.core.autotune import retire
from byteps.core.api import Tensor, tensor_key
from byteps.server.decls import Tensors
from byteps.server.retire import KeyRetirement
from byteps.server.store import Slot, apply
from byteps.transport.wire import MAX_FREE_KEYS, PULL, PUSH, Entry, WireError, free_body

MB = 1 << 20
ENV = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2", "DMLC_PS_ROOT_URI": "127.0.0.1",
       "DMLC_PS_ROOT_PORT": "9000"}


def test_free_body_is_validated_field_by_field():
    assert free_body({"keys": [1, 2, (1 << 63) - 1]}) == [1, 2, (1 << 63) - 1]
    for bad in ({}, {"keys": []}, {"keys": [1], "x": 1}, {"keys": "1"}, {"keys": [1, 1]},
                {"keys": [-1]}, {"keys": [1 << 63]}, {"keys": [1.0]}, {"keys": [True]},
                {"keys": list(range(MAX_FREE_KEYS + 1))}, [1]):
        with pytest.raises(WireError):
            free_body(bad)


class _Engine:
    def __init__(self, cfg):
        self.cfg, self.fatal, self.requests = cfg, None, []

    def request(self, item):
        self.requests.append(item)


def _worker():
    cfg = Config.from_env(ENV)
    eng = _Engine(cfg)
    st = SimpleNamespace(cfg=cfg, engine=eng, nservers=2, tensors={}, lock=threading.Lock(),
                         rank=0, local=None)
    st.tuner = autotune.Tuner(cfg, 0, 2, eng, tune_partitions=True)
    return st, eng


def _push(st, t):
    """What push_pull_async does to a tensor's key: re-cut after a layout change."""
    autotune.relayout(st, t, t.dtype.itemsize * int(np.prod(t.shape)))
    t.round += 1


def _set(st, n, size):
    st.tuner.set(n, size, 4 * size)
    st.cfg = st.tuner.engine.cfg


def test_worker_hands_over_only_keys_it_is_done_with():
    st, eng = _worker()
    tu = st.tuner
    big = st.tensors["big"] = Tensor("big", np.zeros(4 * MB, np.float32), 4096000, 2)
    busy = st.tensors["busy"] = Tensor("busy", np.zeros(2 * MB, np.float32), 4096000, 2)
    small = st.tensors["small"] = Tensor("small", np.zeros(100, np.float32), 4096000, 2)
    for t in (big, busy, small):
        _push(st, t)
    base = tensor_key("big")
    _set(st, 1, 1 * MB)                       # trial 1
    for t in (big, busy, small):
        _push(st, t)
    k1 = big.key
    _set(st, 2, 2 * MB)                       # trial 2
    for t in (big, busy, small):
        _push(st, t)
    k2, busy_k2 = big.key, busy.key
    assert len({base, k1, k2}) == 3 and small.key == tensor_key("small")
    busy.busy = 99                            # a handle of it still in flight
    _set(st, 3, 1 * MB)                       # the final choice: trial 1's size
    tu.choice = (1 * MB, 4 * MB)
    retire.at_boundary(st)
    (kind, (keys, again)), = eng.requests
    assert kind == "retire"
    # "big" (idle) is re-cut at once: its final key is trial 1's (its rounds continue
    # there); its initial key and trial 2's go. "busy" is in flight: nothing of it yet.
    # "small" never changed its key.
    assert sorted(keys) == sorted([base, k2])
    assert big.key == k1 and big.round == 1 and not tu.retire.settled
    busy_final = autotune.layout_key(tensor_key("busy"), 1 * MB, 4096000)
    assert sorted(k for n, k in tu.saved if n == "busy") == sorted([tensor_key("busy"),
                                                                   busy_final])
    _push(st, big)                            # round 1 of k1 (round 0 ran in trial 1)
    assert big.key == k1 and big.round == 2
    busy.busy = None                          # its handle finished
    retire.at_boundary(st)
    (_, (keys, _)), = eng.requests[1:]
    assert sorted(keys) == sorted([tensor_key("busy"), busy_k2]) and tu.retire.settled
    assert busy.key == busy_final and not tu.saved
    again(keys[:1])                           # the engine found one still queued
    retire.at_boundary(st)
    (_, (keys2, _)), = eng.requests[2:]
    assert keys2 == keys[:1]
    retire.at_boundary(st)                    # nothing new: no request
    assert len(eng.requests) == 3 and tu.retire.count == 5


def test_an_inferred_steps_choice_frees_nothing_before_it_applies(monkeypatch):
    """In a loop without step marks, the tuner's step runs on a helper thread (steps.py)
    and a final choice made there applies at the next step end.  A helper that chose
    before this boundary reached the retirement used to expose the choice with the old
    layout still in place: every tensor looked settled, the chosen size's key was handed
    over with the others and this rank's rounds of it restarted at 0 while the other
    rank's went on (the job hung; one CI run in 40)."""
    st, eng = _worker()
    tu = st.tuner
    tu.k = 1
    big = st.tensors["big"] = Tensor("big", np.zeros(4 * MB, np.float32), 4096000, 2)
    _push(st, big)
    base = tensor_key("big")
    _set(st, 1, 1 * MB)                       # trial 1
    _push(st, big)
    k1 = big.key
    _set(st, 2, 2 * MB)                       # trial 2, the last
    _push(st, big)
    k2 = big.key
    tu.plan = autotune.Plan(((4096000, 16 << 20), (1 * MB, 4 * MB), (2 * MB, 8 * MB)),
                            1e8, 1e-3, 16e6, ())
    tu.state, tu.trial, tu.start, tu.step = "trial", 2, 2, 2
    tu.times = [[1.0], [0.1], [0.5]]          # trial 1 wins at the next step end
    monkeypatch.setattr(autotune, "_exchange", lambda st, x, name: x)     # one rank's sum
    start = autotune.steps.start

    def start_and_finish(tu, n, exchange):    # the helper thread wins the race
        start(tu, n, exchange)
        tu.pending.join()
    monkeypatch.setattr(autotune.steps, "start", start_and_finish)
    autotune.boundary(st, inferred=True)
    assert tu.choice == (1 * MB, 4 * MB) and tu.queue and eng.requests == []
    assert big.key == k2
    _push(st, big)                            # the step that ends with the old settings
    autotune.boundary(st, inferred=True)      # the choice applies: then keys are freed
    (kind, (keys, _)), = eng.requests
    assert sorted(keys) == sorted([base, k2])
    assert big.key == k1 and big.round == 1   # trial 1's key, its rounds continuing


class _DeclaresWhileRead(Tensor):
    """A tensor whose key, read at a step boundary, lets another thread declare a tensor
    meanwhile (AsyncModelAverage's and DiLoCo's threads push their own names, without the
    main thread's lock): the boundary must not iterate ``st.tensors`` itself."""
    __slots__ = ("_key", "st")

    @property
    def key(self):
        st, self.st = getattr(self, "st", None), None
        if st is not None:
            st.tensors["late"] = Tensor("late", np.zeros(10, np.float32), 4096000, 2)
        return self._key

    @key.setter
    def key(self, value):
        self._key = value


def test_a_tensor_declared_by_another_thread_during_the_boundary():
    st, eng = _worker()
    t = st.tensors["a"] = _DeclaresWhileRead("a", np.zeros(4 * MB, np.float32), 4096000, 2)
    _push(st, t)
    _set(st, 1, 1 * MB)
    _push(st, t)
    st.tuner.choice = (1 * MB, 4 * MB)
    t.st = st                                 # the next read of its key declares "late"
    retire.at_boundary(st)                    # raised "dictionary changed size" before
    assert "late" in st.tensors
    (kind, (keys, _)), = eng.requests
    assert kind == "retire" and keys == [tensor_key("a")]


class _Server:
    """The state of a server that KeyRetirement uses, without sockets."""

    def __init__(self):
        self.drops = transport.RateLimitedLog(logging.getLogger("test"))
        self.tensors = Tensors(self.drops, {}, None, 1)
        self.decls, self.slots = self.tensors.decls, self.tensors.slots
        self.pushers, self.gone, self.joined, self.nworkers = {0, 1}, {}, frozenset(), 2
        self.lock = threading.Lock()
        self.address = "test"
        self.push_maps = {}
        self.replica = SimpleNamespace(in_flight=lambda k, p: False, forget=lambda k: None)
        self.retire = KeyRetirement(self)

    def declare(self, key, parts=2):
        self.decls[key] = {"name": f"t{key}", "shape": [parts * 4], "dtype": 0}
        for p in range(parts):
            self.slots[(key, p)] = Slot(key, p, 0, 4, -1)


def _round(srv, key, ranks, pull=True):
    out = {}
    for r in ranks:
        for p in range(2):
            apply(srv.slots[(key, p)], Entry(key, p, 0, PUSH | (PULL if pull else 0), 0, 4),
                  np.ones(4, np.float32), r, b"w%d" % r, 2, out)
    return out


def test_server_frees_a_key_once_every_rank_asked_and_nothing_is_in_flight(caplog):
    srv = _Server()
    srv.declare(1)
    srv.declare(2)
    srv.declare(3)
    _round(srv, 1, [0, 1])                    # finished and pulled by both
    _round(srv, 2, [0])                       # rank 1 never pushed: in flight
    w0, w1 = {"rank": 0}, {"rank": 1}
    srv.retire.on_free(w0, {"keys": [1, 2, 3, 77]})  # 77: not declared here, ignored
    assert set(srv.decls) == {1, 2, 3} and srv.retire.keys_freed == 0 and 77 not in srv.retire.free_votes
    with caplog.at_level(logging.WARNING, "byteps.server"):
        srv.retire.on_free(w1, {"keys": [1, 2, 3]})
    assert set(srv.decls) == {2} and {k[0] for k in srv.slots} == {2}
    assert srv.retire.keys_freed == 2 and srv.retire.free_refused == 1
    assert "keeps tensor 't2'" in caplog.text and "round 0 of partition" in caplog.text
    srv.retire.on_free(w0, {"keys": "nope"})         # malformed: dropped, nothing changes
    assert set(srv.decls) == {2}


def test_server_keeps_asynchronous_keys_and_unpulled_rounds():
    srv = _Server()
    srv.declare(5)
    srv.slots[(5, 0)].value = np.zeros(4, np.float32)     # an asynchronous key's value
    srv.declare(6)
    _round(srv, 6, [0, 1], pull=False)        # finished, nobody pulled it yet
    for w in ({"rank": 0}, {"rank": 1}):
        srv.retire.on_free(w, {"keys": [5, 6]})
    assert set(srv.decls) == {5, 6} and srv.retire.free_refused == 2

"""Server failover (issue 14): BYTEPS_SERVER_REPLICAS=1 survives a server's SIGKILL.

Real jobs under ``bpslaunch --standalone`` with a hard timeout (2 workers, 2 servers,
tensors cut into partitions on both servers, one fp16-compressed): rank 0 kills the last
server right after starting a step's push_pulls.  Synchronous float32: the final
parameters equal an undisturbed run's bit for bit.  Asynchronous keys: the final values
equal the exact sum of every push (no push lost or added twice).  Without replication the
job still ends with the error naming the server.  Unit tests: the backup's copies and the
deduplication of resent pushes by (rank, key, round), the primary holding results until
the backup confirmed them, and the REPLICA frame validation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, SCRIPTS, read_results, run_job, run_script
from byteps.common.config import Config, ConfigError
from byteps.server import Server
from byteps.server.decls import Tensors
from byteps.server.replica import Replicator
from byteps.server.staleness import AsyncStore
from byteps.server.store import apply
from byteps.transport import RateLimitedLog
from byteps.transport.wire import (ACK, ASYNC, PULL, PUSH, Entry, Op, WireError, decode,
                                   encode)

pytestmark = pytest.mark.timeout(120)
STEPS, KILL = 30, 12
FAST = {"BYTEPS_PARTITION_BYTES": 262144, "BYTEPS_HEARTBEAT_INTERVAL": 0.3}


def _job(tmp_path, name: str, kill: int, **env):
    out = tmp_path / name
    out.mkdir()
    res = run_script("failover_train.py", out, STEPS, kill, workers=2, servers=2, timeout=90,
                     **FAST, **env)
    return res, out, read_results(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An undisturbed run without replication: (final parameters, digest)."""
    ref, ref_dir, ranks = _job(tmp_path_factory.mktemp("failover"), "undisturbed", -1)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return np.load(ref_dir / "params.npz"), ranks[0]["digest"]


def test_server_sigkill_with_replicas_is_bit_exact(tmp_path, reference):
    """An undisturbed run (no replication) against: rank 0 SIGKILLs the last server right
    after starting step 12; that server answers one worker's round 12 of a partition and
    then SIGKILLs itself (the other worker needs the backup's copy of that round: it would
    wait forever without it); the SIGKILL with 5% of the messages to servers and workers
    dropped (resends and the failover's resends deduplicated together); and the SIGKILL
    followed by shutdown() and init() on every rank (the re-formed group's address book
    marks the dead server lost: the workers never greet it)."""
    a, digest = reference
    for name, kill, env in (("killed", KILL, {}),
                            ("crashed", -1, {"BYTEPS_TEST_SERVER_CRASH": f"1:{KILL}"}),
                            ("lossy", KILL, {"BYTEPS_TEST_DROP_RATE": 0.05,
                                             "BYTEPS_RESEND_TIMEOUT_S": 0.2}),
                            ("reinit", KILL, {"FAILOVER_REINIT_AT": KILL + 5})):
        res, out, ranks = _job(tmp_path, name, kill, BYTEPS_SERVER_REPLICAS=1, **env)
        log = res.stdout + res.stderr
        assert res.returncode == 0, log[-4000:]
        assert "its backup server takes over, the job goes on" in log, log[-3000:]
        assert ranks[0].get("killed") or "BYTEPS_TEST_SERVER_CRASH" in log, log[-3000:]
        assert all(r["steps"] == STEPS and r["error"] is None for r in ranks.values()), ranks
        assert ranks[0]["digest"] == ranks[1]["digest"] == digest, name
        b = np.load(out / "params.npz")
        for k in a.files:
            assert a[k].dtype == np.float32 and a[k].tobytes() == b[k].tobytes(), (name, k)


def test_a_server_lost_while_the_workers_greet_it(tmp_path, reference):
    """Server 1 SIGKILLs itself on a worker's first HELLO (BYTEPS_TEST_SERVER_CRASH=1:-1),
    before any data, while init() waits for every server's answer.  The waiting workers
    send heartbeats and read the scheduler's FAILOVER meanwhile: they stop waiting for the
    dead server and are not declared dead themselves (they were, after
    BYTEPS_HEARTBEAT_TIMEOUT); the job trains on the backup, bit for bit."""
    _, digest = reference
    res, _, ranks = _job(tmp_path, "greeting", -1, BYTEPS_SERVER_REPLICAS=1,
                           BYTEPS_TEST_SERVER_CRASH="1:-1", BYTEPS_HEARTBEAT_TIMEOUT=4)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert "a worker's HELLO, now SIGKILL" in log and "takes over" in log, log[-3000:]
    assert all(r["steps"] == STEPS and r["error"] is None for r in ranks.values()), ranks
    assert ranks[0]["digest"] == ranks[1]["digest"] == digest


def test_async_keys_survive_a_server_sigkill_exactly_once(tmp_path):
    res, _, ranks = _job(tmp_path, "async", KILL, BYTEPS_SERVER_REPLICAS=1,
                         BYTEPS_ENABLE_ASYNC=1)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert all(r["steps"] == STEPS and r["async_mismatch"] == [] for r in ranks.values()), \
        json.dumps(ranks)[:2000]


def test_without_replicas_a_dead_server_still_ends_the_job(tmp_path):
    res, _, ranks = _job(tmp_path, "plain", KILL)
    assert res.returncode != 0
    victim = ranks[0]["killed"]
    errors = [r["error"] for r in ranks.values() if r.get("error")]
    # "... died: ..." (the scheduler's word) or "... is unreachable ..." (the worker's own)
    assert errors and all("server" in e and f"pid {victim})" in e for e in errors), \
        (ranks, res.stderr[-2000:])
    assert "takes over" not in res.stderr


def test_workers_end_by_themselves_before_sigterm(tmp_path):
    """A dead server ends the job; bpslaunch SIGTERMs the workers only after they had a
    moment to end by themselves (each one's ``finally`` takes 1 s here): without that
    wait a worker died in its ``finally`` whenever the scheduler named the dead server
    first (what made test_without_replicas_a_dead_server_still_ends_the_job flaky)."""
    res = run_script("slow_cleanup.py", tmp_path, workers=2, servers=2, timeout=60, **FAST)
    assert res.returncode != 0
    for r in (0, 1):
        f = tmp_path / f"cleanup{r}"
        assert f.exists(), (r, res.stderr[-3000:])
        assert "server" in f.read_text(), f.read_text()
    assert "root cause: server" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]


@pytest.mark.root
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces); CI runs as root")
def test_failover_in_the_emulated_cluster(tmp_path, reference):
    """Scheduler and worker 0 on host 0, worker 1 on host 1, one server on each of hosts 2
    and 3 (network namespaces, benchmarks/cluster): rank 0 SIGKILLs the server of host 3
    mid-training; the job completes with the parameters of an undisturbed loopback run."""
    from benchmarks.cluster import jobs, netns
    out = tmp_path / "netns"
    out.mkdir()
    plan = netns.Plan.new(4)
    h = plan.hosts
    argv = [sys.executable, str(SCRIPTS / "failover_train.py"), str(out), str(STEPS), str(KILL)]
    specs = jobs.byteps_job([h[0], h[1]], [h[2], h[3]], h[0], argv, 9123,
                            dict(FAST, BYTEPS_SERVER_REPLICAS=1, BYTEPS_ENABLE_IPC=0))
    logs = [tmp_path / f"spec{i}.log" for i in range(len(specs))]
    with netns.Cluster(plan):
        procs = [subprocess.Popen(s.command(plan), stdout=f.open("w"), stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=ROOT)
                 for s, f in zip(specs, logs)]
        workers = [p for s, p in zip(specs, procs) if s.what.startswith("worker")]
        deadline = time.monotonic() + 80
        try:
            while time.monotonic() < deadline and any(p.poll() is None for p in workers):
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                p.wait(10)
    text = "\n".join(f"--- {s.what}\n{f.read_text()[-2500:]}" for s, f in zip(specs, logs))
    assert [p.returncode for p in workers] == [0, 0], text
    ranks = read_results(out)
    assert ranks[0].get("killed") and "its backup server owns its keys" in text, text
    assert ranks[0]["digest"] == ranks[1]["digest"] == reference[1], text


def test_nodes_must_agree_on_replicas():
    """A worker without BYTEPS_SERVER_REPLICAS=1 (the scheduler and servers have it) is
    refused at registration, naming the variable: a failover would lose its rounds."""
    code = ("import os; os.environ['BYTEPS_SERVER_REPLICAS'] = '0'; "
            "import byteps.numpy as bps; bps.init(); bps.shutdown()")
    res = run_job([sys.executable, "-c", code], workers=2, servers=2, timeout=60,
                  BYTEPS_SERVER_REPLICAS=1)
    assert res.returncode != 0
    assert "BYTEPS_SERVER_REPLICAS=0 but the scheduler has BYTEPS_SERVER_REPLICAS=1" in \
        res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- units (no sockets)
class _Sock:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, copy=True):
        self.sent.append(frames)


class _Link:
    node_id, epoch = 1, 1


class _Srv:
    """The parts of a Server that the replicator and the store use."""

    def __init__(self):
        self.cfg = Config(server_replicas=1, job_id="t")
        self.secret = None
        self.link = _Link()
        self.peers, self.peer_fds = {}, {}
        self.drops = RateLimitedLog(__import__("logging").getLogger("t"))
        self.tensors = Tensors(self.drops, self.peers, self.send, 1)
        self.decls, self.slots = self.tensors.decls, self.tensors.slots   # as Server.__init__
        self.async_store = AsyncStore(None)
        self.nworkers, self.joined, self.gone = 2, frozenset(), {}
        self.joined_ranks, self.local_reduce = frozenset(), "off"   # as Server.__init__
        self.leaves: dict = {}       # rank -> reduction tree position (server/tree.py)
        self.workers_by_id = {10: {"rank": 0, "host_id": "h0"}, 11: {"rank": 1, "host_id": "h1"}}
        self.results, self.sent = [], []
        self.address = "tcp://x"

    apply = Server.apply
    async_ranks = Server.async_ranks

    def send_results(self, out):
        self.results.append(self.replica.hold(out))

    def send(self, ident, op, body, payload=()):
        self.sent.append((ident, op, body))


DECL = [77, "t.w", [4], 0, 0, []]


def _backup(entries, ranks, frames):
    srv = _Srv()
    rep = srv.replica = Replicator(srv)
    rep.servers = {2: {"node_id": 2, "host_id": "h"}}
    rep.server_ids = {2}
    rep.peers[b"p"] = rep.servers[2]
    hdr, payload = decode(encode("t", 2, Op.REPLICA, 1, 5, [entries, [DECL], ranks])
                          + frames, "t", None)
    rep.on_peer(b"p", hdr, payload, [])
    return srv


def test_backup_answers_a_copied_round_and_never_adds_a_resent_push():
    result = np.array([3, 5, 7, 9], np.float32)
    srv = _backup([[77, 0, 5, PULL, 0, 4]], [-1], [result.tobytes()])
    assert srv.sent[-1][1] == Op.REPLICA_OK and srv.sent[-1][2][0] == [Entry(77, 0, 5, ACK, 0, 4)]
    slot = srv.slots[(77, 0)]
    out: dict = {}
    # after the failover: rank 0 resends its push of round 5 (other data): the copy answers
    apply(slot, Entry(77, 0, 5, PUSH | PULL, 0, 4), np.ones(4, np.float32), 0, b"w0", 2, out)
    apply(slot, Entry(77, 0, 5, PUSH | PULL, 0, 4), np.ones(4, np.float32), 1, b"w1", 2, out)
    for ident in (b"w0", b"w1"):
        assert np.array_equal(out[ident][0][1], result)
    # round 6 on the new owner: a resent push of (rank 0, key 77, round 6) counts once
    out = {}
    a, b = np.full(4, 2, np.float32), np.full(4, 10, np.float32)
    apply(slot, Entry(77, 0, 6, PUSH | PULL, 0, 4), a, 0, b"w0", 2, out)
    apply(slot, Entry(77, 0, 6, PUSH | PULL, 0, 4), a, 0, b"w0", 2, out)
    apply(slot, Entry(77, 0, 6, PUSH | PULL, 0, 4), b, 1, b"w1", 2, out)
    assert np.array_equal(out[b"w1"][0][1], a + b)


def test_backup_adds_a_forwarded_async_push_once():
    d0 = np.array([1, 2, 3, 4], np.float32)
    srv = _backup([[77, 0, 3, PUSH | ASYNC, 0, 4]], [0], [d0.tobytes()])
    slot = srv.slots[(77, 0)]
    out: dict = {}
    # the dead server's rank-0 push of round 3 is resent to the backup: not added again
    srv.apply(slot, Entry(77, 0, 3, PUSH | PULL | ASYNC, 0, 4), d0, 0, b"w0", out)
    d1 = np.full(4, 10, np.float32)
    srv.apply(slot, Entry(77, 0, 3, PUSH | PULL | ASYNC, 0, 4), d1, 1, b"w1", out)
    assert np.array_equal(out[b"w1"][-1][1], d0 + d1)


def test_primary_holds_results_until_the_backup_confirms():
    srv = _Srv()
    rep = srv.replica = Replicator(srv)
    srv.decls[77] = {"name": "t.w", "shape": [4], "dtype": 0, "rank": 0, "comp": None}
    rep.backup, rep.ready, rep.sock = {"node_id": 2}, True, _Sock()
    res = np.arange(4, dtype=np.float32)
    ack = (Entry(77, 0, 5, ACK, 0, 4), None)
    now = rep.hold({b"w0": [ack, (Entry(77, 0, 5, PULL, 0, 4), res)],
                    b"w1": [(Entry(77, 0, 5, PULL, 0, 4), res)]})
    assert now == {b"w0": [ack]}                        # acks go, the results wait
    assert len(rep.sock.sent) == 1                      # the round went to the backup once
    hdr, payload = decode(rep.sock.sent[0], "t", None)
    assert hdr.op == Op.REPLICA and hdr.body[0] == [[77, 0, 5, PULL, 0, 4]]
    assert hdr.body[1][0][:2] == [77, "t.w"] and bytes(payload[0]) == res.tobytes()
    rep.confirm([[77, 0, 5, ACK, 0, 4]])
    assert sorted(srv.results[-1]) == [b"w0", b"w1"]
    # a later pull of the confirmed round goes at once; failover releases what waits
    assert rep.hold({b"w0": [(Entry(77, 0, 5, PULL, 0, 4), res)]}) != {}
    assert rep.hold({b"w0": [(Entry(77, 0, 6, PULL, 0, 4), res)]}) == {}
    rep.on_failover({"dead": {"node_id": 2}, "reason": "test"})
    assert srv.results[-1] == {b"w0": [(Entry(77, 0, 6, PULL, 0, 4), res)]}
    assert not rep.active and rep.hold({b"w1": [(Entry(77, 0, 7, PULL, 0, 4), res)]}) != {}


@pytest.mark.parametrize("body", [
    [[[1, 0, 0, PULL, 0, 1]], [], []],                  # one rank per entry
    [[[1, 0, 0, PULL | ACK, 0, 1]], [], [-1]],          # payload travels in a frame
    [[[1, 0, 0, PULL, 0, 1]], [], ["0"]],
    [[[1, 0, 0, PULL, 0, 1]], []],
])
def test_replica_frames_are_validated(body):
    with pytest.raises(WireError):
        decode(encode("t", 2, Op.REPLICA, 1, 5, body) + [b"1234"], "t", None)


@pytest.mark.parametrize("body", [
    {"dead": {"node_id": "2"}, "reason": "x"}, {"dead": {"node_id": 2}},
    {"dead": {"node_id": 2, "pid": "1"}, "reason": "x"}, {"dead": [2], "reason": "x"},
    {"dead": {"node_id": 2, "code": "1"}, "reason": "x"}, {"dead": {"node_id": 2}, "reason": 1},
])
def test_failover_bodies_are_validated(body):
    from byteps.transport.wire import failover_body
    with pytest.raises(WireError):
        failover_body(body)
    assert failover_body({"dead": {"node_id": 2, "pid": 5, "host": "h", "rank": -1,
                                   "role": "server", "address": None}, "reason": "r"})


def test_replicas_need_two_servers():
    env = {"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
           "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
           "BYTEPS_SERVER_REPLICAS": "1"}
    with pytest.raises(ConfigError, match="BYTEPS_SERVER_REPLICAS"):
        Config.from_env(env)
    assert Config.from_env(dict(env, DMLC_NUM_SERVER="2")).server_replicas == 1


class _Sched:
    """The parts of a Scheduler that failover.Failover uses."""

    def __init__(self, replicas: int):
        self.cfg = Config(server_replicas=replicas)
        self.formed, self.exited, self.join_reset, self.sent = True, set(), None, []
        self.servers = {b"s1": {"node_id": 1, "role": "server"},
                        b"s2": {"node_id": 2, "role": "server"}}

    def send(self, ident, op, body):
        self.sent.append((ident, op))

    def broadcast(self, op, body):
        self.sent.append(("all", op, body["dead"]["node_id"]))


def test_scheduler_survives_one_server_death_only_with_replicas():
    from byteps.scheduler.failover import Failover
    s = _Sched(1)
    f = Failover(s)
    assert not f.survive({"role": "worker", "node_id": 3}, "a worker died")
    assert f.survive({"role": "server", "node_id": 2}, "server 2 died")
    assert s.exited == {b"s2"} and ("all", Op.FAILOVER, 2) in s.sent
    assert (b"s2", Op.TERMINATE) in s.sent           # in case it was merely unreachable
    assert not f.survive({"role": "server", "node_id": 1}, "server 1 died too")
    s0 = _Sched(0)
    assert not Failover(s0).survive({"role": "server", "node_id": 2}, "died") and not s0.sent

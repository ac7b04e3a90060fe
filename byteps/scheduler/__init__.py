"""The scheduler: rendezvous, barriers, heartbeats.  It never touches tensor data.

Nodes register (role, host, port, protocol version, job id); once every
server and every worker of every host is there, each gets its node id, its
rank and the address book.  Nodes beyond the configured counts or with
another job id/version are refused with a reason (and a misconfigured
node ends the job at once).  Every message must carry a valid MAC (the job
secret), come from a node id this scheduler assigned, over that node's
connection, with a higher sequence number than the last and a current epoch.
A node that stops sending heartbeats, or whose TCP connection closes and
stays closed for ``2 x BYTEPS_HEARTBEAT_INTERVAL + 0.5`` s, is declared dead
and every live node is told; the job then ends.
"""
from __future__ import annotations

import logging
import sys
import time

import zmq

from byteps import transport
from byteps.common.config import Config
from byteps.common.config import scheduler_listen_host as _bind_host
from byteps.common.node import (PEER_FAILED_EXIT, BytePSError, describe, down_grace,
                                require_secret)
from byteps.scheduler import lost, membership, reinit, resume
from byteps.scheduler.checks import _check_local_reduce, _check_tuning, _pushers
from byteps.scheduler.deadlock import Deadlocks
from byteps.scheduler.departures import Departures
from byteps.scheduler.failover import Failover
from byteps.scheduler.registration import missing, node_info, replay_key
from byteps.scheduler.metrics import serve_scheduler
from byteps.transport.wire import (PROTOCOL_VERSION, Op, VersionMismatch, WireError, decode,
                                   encode, new_seq)

log = logging.getLogger("byteps.scheduler")


class Scheduler:
    """Holds ``departures`` (barriers, join(), leaving), ``elastic`` and ``failover``."""
    view = None     # byteps.dashboard's JobView (metrics.serve_scheduler): reports, stalls

    def __init__(self, cfg: Config):
        require_secret(cfg, "scheduler")
        self.cfg = cfg
        self.secret = cfg.job_secret.encode() if cfg.job_secret else None
        self.ctx = zmq.Context()
        host = _bind_host(cfg.root_uri)      # where every node connects: DMLC_PS_ROOT_URI
        self.sock, self.address = transport.listen(self.ctx, f"tcp://{host}:{cfg.root_port}",
                                                   1 << 20)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.watch = transport.ConnWatch(self.sock)
        self.fds: dict[int, bytes] = {}       # TCP connection -> identity of a node
        self.seen_registrations: set = set()  # (role, host_id, pid, seq): replay guard
        self.drops = transport.RateLimitedLog(log)
        self.servers: dict[bytes, dict] = {}
        self.workers: dict[bytes, dict] = {}
        self.hosts: dict[str, dict] = {}      # host_id -> {local_size, worker_id, order}
        self.formed, self.resumed_size = False, 0     # resumed_size: resume.py
        # a job restarted by bpslaunch --max-restarts starts in a new range of epochs, so
        # that no frame of an earlier incarnation (same job id and secret) is ever current
        self.epoch = cfg.restart_count << 16
        self.seq = new_seq()
        self.left: set[bytes] = set()       # workers that called shutdown()
        self.exited: set[bytes] = set()
        self.rejoin: dict[bytes, dict] = {}
        self.early_rejoin: dict[bytes, tuple] = {}   # re-registration that beat its LEAVE
        self.all_left_since: float | None = None
        self.started = time.monotonic()
        self.rejoin_since = None
        self.exit_code = None
        self.stall_reports = 0              # STALL messages received (metrics)
        # after a refusal that ends the job before it formed: tell late registrants too
        self.linger_reason: str | None = None
        self.linger_until = 0.0
        self.told: set[bytes] = set()
        # barriers, join() (uneven data) and clean departures within an epoch
        self.departures = Departures(self.send, self.drops)
        self.elastic = membership.from_config(self)   # BYTEPS_MIN_WORKERS: elastic membership
        self.failover = Failover(self)        # BYTEPS_SERVER_REPLICAS: a server's death survived
        self.deadlocks = Deadlocks(self)      # every worker waits in another collective

    # the departures' state, as failover.py and membership.py read and reset it
    barriers = property(lambda self: self.departures.barriers)
    joined = property(lambda self: self.departures.joined)
    gone = property(lambda self: self.departures.gone)
    join_reset = property(lambda self: self.departures.join_reset,
                          lambda self, v: setattr(self.departures, "join_reset", v))
    join_done = property(lambda self: self.departures.join_done)

    # ---------------------------------------------------------------- sending
    def send(self, ident: bytes, op: int, body: dict, job_id: str | None = None) -> None:
        self.seq += 1
        try:
            self.sock.send_multipart([ident] + encode(job_id or self.cfg.job_id, 0, op, self.epoch,
                                                      self.seq, body, self.secret))
        except zmq.ZMQError as exc:   # peer gone (ROUTER_MANDATORY)
            log.debug("cannot send %s to %r: %s", Op(op).name, ident, exc)

    def broadcast(self, op: int, body: dict, skip: bytes | None = None) -> None:
        for ident in list(self.servers) + list(self.workers):
            if ident != skip and ident not in self.exited:
                self.send(ident, op, body)

    # ---------------------------------------------------------------- main loop
    def run(self) -> int:
        log.info("scheduler listening on %s for %d worker host(s) and %d server(s)",
                 self.address, self.cfg.num_worker, self.cfg.num_server)
        try:
            while self.exit_code is None:
                if self.sock.poll(200):
                    for _ in range(64):
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self.handle(frames)
                        if self.exit_code is not None:
                            break
                now = time.monotonic()
                self.check_connections(now)
                self.check_time(now)
            return self.exit_code
        finally:
            self.watch.close()
            self.sock.close(200)       # TERMINATE messages leave first (at most 200 ms)
            self.ctx.term()

    def handle(self, frames: list) -> None:
        fd = transport.source_fd(frames[1]) if len(frames) > 1 else -1
        ident, frames = frames[0].bytes, frames[1:]
        try:
            hdr, _ = decode(frames, self.cfg.job_id, self.secret, check_job=False)
        except VersionMismatch as exc:       # authenticated, so a misconfigured node
            if exc.op == Op.REGISTER:
                self.refuse(ident, f"a node runs BytePS protocol version {exc.version} but the "
                            f"scheduler runs version {PROTOCOL_VERSION}; install the same "
                            f"byteps release on every node", fatal=True)
            else:
                self.drops.warn("message of another protocol version", str(exc))
            return
        except WireError as exc:
            self.drops.warn("malformed or unauthenticated message", str(exc))
            return
        if hdr.job_id != self.cfg.job_id:
            reason = (f"job id {hdr.job_id!r} does not match the scheduler's "
                      f"BYTEPS_JOB_ID={self.cfg.job_id!r}; every node of a job must use the "
                      f"same BYTEPS_JOB_ID")
            if hdr.op == Op.REGISTER:
                self.refuse(ident, f"{hdr.body.get('role')} at {hdr.body.get('host')} (pid "
                            f"{hdr.body.get('pid')}): {reason}", fatal=True, job_id=hdr.job_id)
            else:
                self.drops.warn("message of another job", reason)
            return
        if self.linger_reason is not None:
            if hdr.op == Op.REGISTER and ident not in self.told:
                self.told.add(ident)
                self.send(ident, Op.TERMINATE, {"ok": False, "reason": self.linger_reason})
            return
        if hdr.op == Op.LOST:           # a cluster bpslaunch: a process it started died
            return lost.on_lost(self, hdr.body)
        node = self.servers.get(ident) or self.workers.get(ident)
        if hdr.op == Op.REGISTER:
            key = replay_key(self, ident, hdr)
            if key in self.seen_registrations:
                return self.drops.warn("replayed registration", repr(key)[:200])
            self.seen_registrations.add(key)
            if fd >= 0 and self.elastic is not None and self.formed:
                self.elastic.note_conn(fd, ident)    # it may die waiting (membership.py)
            try:
                self.register(ident, hdr.body, hdr.seq)
            except (WireError, TypeError) as exc:
                self.drops.warn("bad registration", str(exc))
            return
        if node is None or hdr.sender != node.get("node_id"):
            if self.elastic is None or not self.elastic.fence(ident):   # a removed worker
                self.drops.warn("message from a node id the scheduler did not assign (or "
                                "over another connection)", f"op {Op(hdr.op).name}")
            return
        if hdr.seq <= node.get("seq", -1) or hdr.epoch < node.get("epoch", 0):
            self.drops.warn("replayed or stale message", f"{describe(node)}: op "
                            f"{Op(hdr.op).name}, seq {hdr.seq} (last {node.get('seq')}), epoch "
                            f"{hdr.epoch} (node's {node.get('epoch')})")
            return
        node["seq"] = hdr.seq
        if fd >= 0:
            self.fds[fd] = ident
        node["last_seen"] = time.monotonic()
        node.pop("down_since", None)
        if self.view is not None:      # the dashboard and the hang doctor (byteps/dashboard)
            self.view.note(ident, node, hdr)
        if hdr.op == Op.HEARTBEAT:
            self.deadlocks.note(ident, hdr.body)     # blocked workers (deadlock.py)
            self.send(ident, Op.HEARTBEAT_ACK, self.view.ack(ident) if self.view else {})
        elif hdr.op == Op.BARRIER:
            self.departures.barrier(ident, hdr.body, self.workers)
        elif hdr.op == Op.LEAVE:
            self.left.add(ident)
            early = self.early_rejoin.pop(ident, None)
            if early is not None:
                self.register_again(*early)
            elif self.elastic is not None and self.elastic.on_leave(ident):
                pass                   # leaves to re-form the group (membership.py)
            elif ident in self.workers and self.formed:
                self.departures.worker_gone(ident, node, "left the job (called shutdown())",
                                            self.workers, self.servers)
        elif hdr.op == Op.JOIN and ident in self.workers:
            self.departures.join(ident, node, self.workers, self.servers,
                                 set(self.servers) - self.exited)
        elif hdr.op == Op.MEMBERS_OK and ident in self.servers:
            self.departures.members_ok(ident, hdr.body)
        elif hdr.op == Op.EXIT:
            self.node_exit(ident, node, hdr.body)
        elif hdr.op == Op.STALL:
            text = str(hdr.body.get("text"))[:4000]
            self.stall_reports += 1
            if hdr.body.get("fatal") is True:
                self.fail(f"stalled longer than BYTEPS_STALL_SHUTDOWN_S="
                          f"{self.cfg.stall_shutdown_s:g} s: {text}")
            else:
                log.warning("stall reported by %s: %s", describe(node), text)

    # ---------------------------------------------------------------- registration
    def register(self, ident: bytes, b: dict, seq: int = -1) -> None:
        role = b.get("role")
        if role not in ("server", "worker"):
            raise WireError(f"bad role {role!r}")
        for k, want, var, unset in (
                ("num_worker", self.cfg.num_worker, "DMLC_NUM_WORKER", None),
                ("num_server", self.cfg.num_server, "DMLC_NUM_SERVER", None),
                ("replicas", self.cfg.server_replicas, "BYTEPS_SERVER_REPLICAS", 0)):
            if b.get(k, unset) != want:
                return self.refuse(ident, f"{role} at {b.get('host')} (pid {b.get('pid')}) has "
                                   f"{var}={b.get(k)} but the scheduler has {var}={want}; "
                                   f"every node of a job must use the same value", fatal=True)
        if b.get("resume") is not None:     # a restarted scheduler: a node comes back
            return resume.adopt(self, ident, b, seq)
        info = node_info(b, seq)
        if role == "server":
            if any(s["address"] == info["address"] for s in self.servers.values()):
                return self.refuse(ident, f"a server at {info['address']} is already "
                                   f"registered (replayed registration?)")
            if self.formed or len(self.servers) >= self.cfg.num_server:
                return self.refuse(ident, f"server at {info['host']} (pid {info['pid']}) is one "
                                   f"too many: DMLC_NUM_SERVER={self.cfg.num_server} already "
                                   f"registered")
            self.servers[ident] = info
        elif self.formed and self.elastic is not None:
            return self.elastic.register(ident, info)
        elif self.formed:
            return self.register_again(ident, info)
        else:
            err = _check_tuning(info, self.workers)
            if err:         # ranks would cut tensors differently: end the job, say why
                return self.refuse(ident, err, fatal=True)
            err = self.add_worker(ident, info, self.workers, self.hosts)
            if err:
                return self.refuse(ident, err)
        self.maybe_form()

    def add_worker(self, ident, info, workers, hosts) -> str | None:
        err = _check_local_reduce(info, workers, hosts)
        if err:
            return err
        h = hosts.get(info["host_id"])
        if h is None:
            if len(hosts) >= self.cfg.num_worker:
                return (f"worker at host {info['host_id']} is one host too many: "
                        f"DMLC_NUM_WORKER={self.cfg.num_worker} hosts already registered "
                        f"({', '.join(hosts)})")
            h = hosts[info["host_id"]] = {"local_size": info["local_size"],
                                           "worker_id": info["worker_id"],
                                           "order": len(hosts), "slots": {}}
        if info["local_size"] != h["local_size"]:
            return (f"host {info['host_id']}: local rank {info['local_rank']} has "
                    f"BYTEPS_LOCAL_SIZE={info['local_size']}, another has {h['local_size']}")
        if info["local_rank"] in h["slots"]:
            return (f"host {info['host_id']}: local rank {info['local_rank']} registered twice "
                    f"(pids {h['slots'][info['local_rank']]} and {info['pid']})")
        h["slots"][info["local_rank"]] = info["pid"]
        workers[ident] = info
        return None

    def refuse(self, ident: bytes, reason: str, fatal: bool = False,
               job_id: str | None = None) -> None:
        log.error("refused a node: %s", reason)
        self.send(ident, Op.REFUSED, {"reason": reason}, job_id)   # in the node's job id
        self.told.add(ident)
        if fatal:
            self.fail(f"a node was refused: {reason}", linger=True)

    def complete(self, workers, hosts) -> bool:
        want = self.elastic.before_formation() if self.elastic is not None \
            else self.cfg.num_worker      # (elastic: less the workers dead at start-up)
        return (len(self.servers) == self.cfg.num_server and len(hosts) == want
                and all(len(h["slots"]) == h["local_size"] for h in hosts.values()))

    def maybe_form(self) -> None:
        if self.resumed_size:           # a restarted scheduler takes the job back (resume.py)
            return resume.tick(self)
        if self.formed or not self.complete(self.workers, self.hosts):
            return
        self.formed = True
        self.epoch += 1
        now = time.monotonic()
        for n in list(self.servers.values()) + list(self.workers.values()):
            n["last_seen"] = now      # heartbeats are checked from formation on
        self.assign(self.workers, self.hosts)
        log.info("job formed: %d server(s), %d worker(s), epoch %d",
                 len(self.servers), len(self.workers), self.epoch)
        self.send_books(list(self.servers) + list(self.workers))

    def assign(self, workers, hosts) -> None:
        ids = [h for h in hosts.values()]
        if all(h["worker_id"] >= 0 for h in ids):
            ids.sort(key=lambda h: h["worker_id"])
        else:
            ids.sort(key=lambda h: h["order"])
        base = 0
        for h in ids:
            h["base"] = base
            base += h["local_size"]
        nid = 1
        for ident, s in self.servers.items():
            s["node_id"], s["rank"] = nid, -1
            nid += 1
        for ident, w in sorted(workers.items(), key=lambda kv: (hosts[kv[1]["host_id"]]["base"],
                                                               kv[1]["local_rank"])):
            w["rank"] = hosts[w["host_id"]]["base"] + w["local_rank"]
            w["node_id"] = nid
            nid += 1

    def book(self) -> dict:
        pub = ("node_id", "rank", "host", "host_id", "pid", "local_rank", "local_size", "machine")
        return {"servers": [{**{k: s[k] for k in pub}, "address": s["address"], "role": "server",
                             **({"lost": True} if s.get("lost") else {})}    # failover.py
                            for s in self.servers.values()],
                "workers": sorted(({**{k: w[k] for k in pub}, "role": "worker",
                                    "address": w.get("address")}     # peers (decentralized)
                                   for w in self.workers.values()), key=lambda w: w["rank"]),
                "size": len(self.workers), "epoch": self.epoch, **_pushers(self.workers),
                **({"elastic_gen": self.elastic.formed_gen} if self.elastic else {})}

    def send_books(self, idents) -> None:
        book = self.book()
        for ident in idents:
            n = self.servers.get(ident) or self.workers[ident]
            n["epoch"] = self.epoch
            self.send(ident, Op.REGISTER_OK, {**book, "node_id": n["node_id"], "rank": n["rank"]})

    def register_again(self, ident: bytes, info: dict) -> None:
        reinit.register_again(self, ident, info)

    def node_exit(self, ident: bytes, node: dict, body: dict) -> None:
        self.exited.add(ident)
        if body.get("ok") is not True:
            reason = str(body.get("reason", "unknown"))
            quiet = reason.startswith("KeyboardInterrupt")      # Ctrl-C: no error
            self.fail(f"{describe(node)} was interrupted (KeyboardInterrupt)" if quiet else
                      f"{describe(node)} exited with an error: {reason}", dead=node, quiet=quiet)
            return
        if ident in self.workers and self.formed:
            self.departures.worker_gone(ident, node, "exited (code 0)", self.workers,
                                        self.servers)
            if self.elastic is None:
                reinit.on_exit(self)     # re-registrations waiting for it: refused now
        if all(w in self.exited for w in self.workers):
            log.info("all workers exited; ending the job")
            self.broadcast(Op.TERMINATE, {"ok": True, "reason": "all workers finished"})
            self.exit_code = 0

    def fail(self, reason: str, dead: dict | None = None, linger: bool = False,
             quiet: bool = False) -> None:
        """End the job: tell every node.  Before formation (``linger``), stay up to
        BYTEPS_STARTUP_TIMEOUT so that nodes still starting fail fast with the reason too."""
        if self.linger_reason is not None:
            return
        if dead and self.failover.survive(dead, reason):
            return
        if dead is not None and self.elastic is not None and self.elastic.on_lost(dead, reason):
            return                     # the group re-forms without it (membership.py)
        (log.info if quiet else log.error)("ending the job: %s", reason)
        body = {"ok": False, "reason": reason, **({"interrupted": True} if quiet else {})}
        if dead:
            body.update(dead={k: dead.get(k) for k in ("role", "rank", "host", "host_id", "pid",
                                                      "node_id", "address")})
            self.broadcast(Op.NODE_DEAD, body)
        else:
            self.broadcast(Op.TERMINATE, body)
        if linger and not self.formed:
            self.linger_reason = reason
            self.linger_until = time.monotonic() + self.cfg.startup_timeout
            self.told.update(self.servers, self.workers)
            return
        # a dead or failed node is the root cause; the scheduler's own end (stall...) is its own
        self.exit_code = PEER_FAILED_EXIT if dead else 1

    def check_time(self, now: float) -> None:
        if self.linger_reason is not None:
            if now > self.linger_until or \
                    len(self.told) >= self.cfg.num_server + self.cfg.num_worker:
                self.exit_code = 1
            return
        if not self.formed:
            self.maybe_form()           # elastic: a worker may have died before registering
            if not self.formed and now - self.started > self.cfg.startup_timeout:
                self.fail(missing(self, now - self.started))
            return
        if self.rejoin_since and now - self.rejoin_since > self.cfg.startup_timeout:
            self.fail(f"re-initialisation: {len(self.rejoin)} of {len(self.workers)} workers "
                      f"called init() again after {self.cfg.startup_timeout:g} s")
            return
        if self.elastic is not None:
            self.elastic.tick(now)
        self.deadlocks.check(now)
        gone = [w for w in self.workers if w in self.exited or w in self.left]
        if len(gone) == len(self.workers) and not self.rejoin and not self.early_rejoin \
                and not (self.elastic is not None and self.elastic.pending):
            # every worker called shutdown() (or exited) and none has called init() again:
            # like the original, shutdown() ends the job (its tests start a new scheduler and
            # servers for the next init() and wait for these to exit); a re-init that comes
            # within BYTEPS_REINIT_WAIT_S re-forms the group instead
            self.all_left_since = self.all_left_since or now
            wait = min(self.cfg.reinit_wait_s, self.cfg.startup_timeout)
            if now - self.all_left_since > wait:
                log.info("all workers called shutdown() and none called init() again within "
                         "%g s (BYTEPS_REINIT_WAIT_S); ending the job", wait)
                self.broadcast(Op.TERMINATE, {"ok": True, "reason": "all workers left"})
                self.exit_code = 0
                return
        else:
            self.all_left_since = None
        for ident, n in list(self.servers.items()) + list(self.workers.items()):
            if ident in self.exited or ident in self.left:
                continue
            role = "server" if ident in self.servers else "worker"
            down = n.get("down_since")
            if down is not None and now - down > down_grace(self.cfg):
                self.fail(f"{describe(dict(n, role=role))}: its connection to the scheduler "
                          f"closed {now - down:.1f} s ago and it sent nothing since; presumed "
                          f"dead (killed, crashed or unreachable)", dead=dict(n, role=role))
                return
            if now - n["last_seen"] > self.cfg.heartbeat_timeout:
                self.fail(f"{describe(dict(n, role=role))} stopped sending heartbeats for "
                          f"{now - n['last_seen']:.1f} s (BYTEPS_HEARTBEAT_TIMEOUT="
                          f"{self.cfg.heartbeat_timeout:g}); presumed dead",
                          dead=dict(n, role=role))
                return

    def check_connections(self, now: float) -> None:
        """Note when the TCP connection of a registered node closes (fast death detection)."""
        for kind, fd, peer in self.watch.poll():
            if kind != "down":
                continue
            if self.elastic is not None:
                self.elastic.on_down(fd, peer)
            ident = self.fds.pop(fd, None)
            n = self.servers.get(ident) or self.workers.get(ident) if ident else None
            if n is not None and ident not in self.exited and ident not in self.left:
                log.info("connection of %s closed", describe(n))
                n.setdefault("down_since", now)


def main(cfg: Config | None = None) -> int:
    from byteps.common.logs import setup_logging
    cfg = cfg or Config.from_env(role="scheduler")
    setup_logging(cfg, "scheduler")
    try:
        sched = Scheduler(cfg)
    except (BytePSError, transport.TransportError) as exc:
        log.error("%s", exc)
        return 2
    serve_scheduler(sched)     # BYTEPS_METRICS_PORT
    return sched.run()


if __name__ == "__main__":
    sys.exit(main())

"""Elastic membership: workers leave and join a running job (docs/fault_tolerance.md).

With ``BYTEPS_MIN_WORKERS`` set (``bpslaunch --min-workers``), the scheduler does not end
the job when a worker dies; it re-forms the group instead:

* **a worker is lost** (its connection closed, its heartbeats stopped, or it exited with
  an error): the surviving workers get ``ELASTIC {removed: true}``; their pending
  push_pulls fail at once with :class:`byteps.core.elastic.WorkersChanged`, and
  ``bps.elastic.run`` restores the last commit, leaves (``LEAVE``) and registers again.
* **a worker asks to join** (it registers after the job formed): the members get
  ``ELASTIC {removed: false}``; at their next ``state.commit()`` every member agrees on
  it (a sum over the members) and raises ``HostsUpdatedInterrupt`` at the same step,
  then leaves and registers again.

When every live member has registered again, the group re-forms: a new membership epoch,
dense ranks (the members in their old order, then the newcomers in arrival order), fresh
node ids, and new address books to the servers (which drop every round of the old epoch)
and to the workers.  Fewer live workers than ``BYTEPS_MIN_WORKERS`` for
``BYTEPS_ELASTIC_TIMEOUT`` seconds end the job, naming the workers lost.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Mapping

from byteps.common.config import ConfigError
from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")

ENV_MIN, ENV_MAX, ENV_TIMEOUT = "BYTEPS_MIN_WORKERS", "BYTEPS_MAX_WORKERS", "BYTEPS_ELASTIC_TIMEOUT"
# bpslaunch --standalone writes the pid of every worker it saw die into this file of
# $BPSLAUNCH_STATUS_DIR (byteps/launcher/elastic.py): a worker dead before the job formed
# is not waited for
LOST_FILE = "lost-workers"


def settings(env: Mapping[str, str], startup_timeout: float = 60.0) -> tuple | None:
    """(min workers, max workers, timeout) from the environment, or None (not elastic).
    Raises ConfigError naming the variable."""
    raw_min = (env.get(ENV_MIN) or "").strip()
    if not raw_min:
        if (env.get(ENV_MAX) or "").strip():
            raise ConfigError(f"{ENV_MAX} is set but {ENV_MIN} is not: elastic training needs "
                              f"both (bpslaunch --min-workers N --max-workers M)")
        return None

    def num(name, raw, lo, cast):
        try:
            v = cast(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number (example: {name}=2)") from None
        if v < lo:
            raise ConfigError(f"{name}={raw} must be >= {lo}")
        return v
    lo = num(ENV_MIN, raw_min, 1, int)
    raw_max = (env.get(ENV_MAX) or "").strip()
    hi = num(ENV_MAX, raw_max, lo, int) if raw_max else 1 << 16
    raw_t = (env.get(ENV_TIMEOUT) or "").strip()
    timeout = num(ENV_TIMEOUT, raw_t, 0.5, float) if raw_t else float(startup_timeout)
    return lo, hi, timeout


def from_config(sched) -> "Elastic | None":
    """The scheduler's elastic membership, or None when BYTEPS_MIN_WORKERS is not set."""
    got = settings(os.environ, sched.cfg.startup_timeout)
    return None if got is None else Elastic(sched, *got)


class Elastic:
    """Re-forms the scheduler's group when workers are lost or ask to join."""

    def __init__(self, sched, min_workers: int, max_workers: int, timeout: float):
        self.s = sched
        self.min, self.max, self.timeout = min_workers, max_workers, timeout
        self.gen = 0                # membership changes announced
        self.formed_gen = 0         # ... and taken into the current group
        self.waiting: dict[bytes, dict] = {}   # registrations since formation (arrival order)
        self.lost: dict[bytes, str] = {}       # members lost in this epoch -> why
        self.short_since: float | None = None
        self.conns: dict[int, tuple] = {}      # fd -> (registration ident, peer address)
        # newcomers over the maximum, held until a loss frees a place (a deleted pod's
        # replacement may register before the loss is noticed) or the heartbeat timeout
        self.parked: dict[bytes, tuple[dict, float]] = {}   # ident -> (info, refuse at)
        self.changes = 0            # groups re-formed
        self.removed: dict[bytes, str] = {}    # lost workers not yet told they were removed
        self._dead: set[int] = set()        # workers dead before formation (dead_at_start)
        self.reported: set[tuple] = set()   # (host id, pid): the same, by LOST (lost.py)
        self._dead_read = float("-inf")
        self._told_dead = False
        self._start = (0, time.monotonic())     # (workers registered, since): start-up
        log.info("elastic membership: %d to %d worker(s), %g s to get back above the minimum",
                 min_workers, max_workers, timeout)

    @property
    def pending(self) -> bool:
        """A change was announced and the group has not re-formed yet."""
        return self.gen > self.formed_gen

    def members(self) -> list[bytes]:
        """Workers of the current group that are neither lost nor exited."""
        return [i for i in self.s.workers if i not in self.s.exited and i not in self.lost]

    def _same(self, a: dict, b: dict) -> bool:
        return all(a.get(k) == b.get(k) for k in ("host_id", "local_rank", "pid"))

    def member_of(self, info: dict) -> bytes | None:
        """The member that registers again (same host, local rank and process), or None."""
        return next((i for i in self.members() if self._same(self.s.workers[i], info)), None)

    # ------------------------------------------------------------------ events
    def register(self, ident: bytes, info: dict) -> None:
        """A worker registered after the job formed: a member after its reset, or a new one."""
        s = self.s
        if info["local_size"] > 1 and info["local_reduce"] != "off":
            return s.refuse(ident, f"worker at host {info['host_id']} local rank "
                            f"{info['local_rank']}: elastic training re-forms the group worker "
                            f"by worker, which local reduction cannot follow; set "
                            f"BYTEPS_LOCAL_REDUCE=0 (or one worker per host)")
        member = self.member_of(info)
        if member is None and self._available() >= self.max:
            wait = s.cfg.heartbeat_timeout + 1.0
            self.parked[ident] = (info, time.monotonic() + wait)
            log.info("elastic: worker at host %s (pid %s) waits up to %g s for a place "
                     "(already %d worker(s), --max-workers %d)", info["host_id"],
                     info["pid"], wait, self.max, self.max)
            return None
        self.waiting[ident] = info
        if member is None:
            self.announce(False, f"a worker at host {info['host_id']} (pid {info['pid']}) "
                                 f"joins the job")
        else:
            s.left.add(member)          # its LEAVE may still be on its way (another stream)
            if not self.pending:        # shutdown() and init() again without a change
                self.announce(False, f"{describe(dict(s.workers[member], role='worker'))} "
                                     f"registered again")
        self.maybe_reform()

    def on_leave(self, ident: bytes) -> bool:
        """A member sent LEAVE: part of a re-formation (True), or a plain shutdown()."""
        if ident not in self.s.workers or not self.pending:
            return False
        self.maybe_reform()
        return True

    def on_lost(self, dead: dict, reason: str) -> bool:
        """A worker died or failed; True when the group re-forms without it (the job goes on)."""
        s = self.s
        if dead.get("role") != "worker":
            return False
        ident = next((i for i, w in s.workers.items() if w.get("node_id") == dead.get("node_id")),
                     None)
        if ident is None:
            return False
        if ident in self.lost:
            return True
        others = [m for m in self.members() if m != ident]
        newcomers = [i for i, w in self.waiting.items() if self.member_of(w) is None]
        if not others and not newcomers:
            return False                # nobody left to go on: the job fails as before
        self.lost[ident] = reason
        self.removed[ident] = reason    # a frozen worker that comes back is told (fence)
        s.exited.add(ident)             # no more heartbeat checks, never counted as alive
        self._unpark()
        log.warning("elastic: %s; re-forming the group with %d worker(s) (--min-workers %d)",
                    reason, len(others) + len(newcomers), self.min)
        self.announce(True, reason)
        self.maybe_reform()
        return True

    def fence(self, ident: bytes) -> bool:
        """A message from a worker removed from the group (presumed dead: frozen, cut off,
        too slow): tell it once that it was removed, so that it ends instead of waiting.
        Its pushes of the old epoch are dropped by the servers; it never joins a round."""
        why = self.removed.pop(ident, None)
        if why is None:
            return False
        log.warning("elastic: a worker removed from the group came back; telling it (%s)", why)
        self.s.send(ident, Op.TERMINATE, {"ok": False, "reason": (
            f"this worker was removed from the job ({why}); the group went on without it "
            f"(epoch {self.s.epoch})")})
        return True

    def note_conn(self, fd: int, ident: bytes) -> None:
        """The TCP connection a registration came in on (fd and peer address: the OS reuses
        fd numbers, so a late "closed" event of an older connection is told apart)."""
        from byteps import transport
        self.conns[fd] = (ident, transport._peer_name(fd))

    def on_down(self, fd: int, peer: str) -> None:
        """A connection closed: a worker waiting to join died before it was let in."""
        got = self.conns.get(fd)
        if got is None or got[1] is None or got[1] != peer:
            return                      # not a waiting registration's (or unknown: keep it)
        del self.conns[fd]
        self.parked.pop(got[0], None)
        info = self.waiting.pop(got[0], None)
        if info is not None:
            log.warning("elastic: worker at host %s (pid %s) died while waiting to join",
                        info["host_id"], info["pid"])
            self.maybe_reform()

    def announce(self, removed: bool, reason: str) -> None:
        """Tell the members still training about membership change ``gen``."""
        s = self.s
        self.gen += 1
        for m in self.members():
            if m not in s.left:
                s.send(m, Op.ELASTIC, {"gen": self.gen, "removed": removed,
                                       "reason": reason[:4000]})

    def _unpark(self) -> None:
        """Let held newcomers wait to join while places are free (arrival order)."""
        while self.parked and self._available() < self.max:
            ident = next(iter(self.parked))
            info, _ = self.parked.pop(ident)
            self.waiting[ident] = info
            log.info("elastic: worker at host %s (pid %s) takes a freed place",
                     info["host_id"], info["pid"])

    def dead_at_start(self) -> set[int]:
        """Pids of workers bpslaunch saw die (read at most every 0.2 s, before formation)."""
        now = time.monotonic()
        if now < self._dead_read + 0.2:
            return self._dead
        self._dead_read = now
        folder = os.environ.get("BPSLAUNCH_STATUS_DIR")
        try:
            with open(os.path.join(folder or "", LOST_FILE)) as f:
                self._dead = {int(t) for t in f.read().split() if t.isdigit()}
        except (OSError, ValueError):
            pass
        return self._dead

    def note_lost(self, host_id: str, pid: int) -> bool:
        """A cluster bpslaunch reported a worker dead before formation (lost.py)."""
        new = (host_id, pid) not in self.reported
        self.reported.add((host_id, pid))
        return new

    def before_formation(self) -> int:
        """Workers expected at formation: DMLC_NUM_WORKER less those that died before it
        (forgotten if they had registered), but never fewer than --min-workers."""
        dead = self.dead_at_start()
        s = self.s
        for ident, w in list(s.workers.items()):
            if w["pid"] in dead or (w["host_id"], w["pid"]) in self.reported:
                del s.workers[ident]
                h = s.hosts.get(w["host_id"])
                if h is not None:
                    h["slots"].pop(w["local_rank"], None)
                    if not h["slots"]:
                        del s.hosts[w["host_id"]]
                log.warning("elastic: %s died before the job formed; forming without it",
                            describe(dict(w, role="worker")))
        if dead and not self._told_dead:
            self._told_dead = True
            log.warning("elastic: %d worker(s) died during start-up; the job forms with the "
                        "%d others once they registered (--min-workers %d)", len(dead),
                        s.cfg.num_worker - len(dead), self.min)
        want = max(self.min, s.cfg.num_worker - len(dead) - len(self.reported))
        # a worker that died before it registered on a cluster (no bpslaunch to tell us):
        # with --min-workers registered and no other for a while, form with them; a late
        # worker joins later like any newcomer
        have, now = len(s.hosts), time.monotonic()
        if have != self._start[0]:
            self._start = (have, now)
        wait = min(self.timeout, s.cfg.startup_timeout / 2)
        if self.min <= have < want and now - self._start[1] >= wait and \
                len(s.servers) == s.cfg.num_server:
            log.warning("elastic: %d of %d worker(s) registered and no other for %g s (one "
                        "died or did not start); the job forms with them (--min-workers %d)",
                        have, want, wait, self.min)
            return have
        return want

    def tick(self, now: float) -> None:
        """Refuse newcomers held past their time; end the job when too few workers stay
        around for BYTEPS_ELASTIC_TIMEOUT."""
        for ident, (info, until) in list(self.parked.items()):
            if now > until:
                del self.parked[ident]
                self.s.refuse(ident, f"worker at host {info['host_id']} (pid {info['pid']}) "
                              f"cannot join: the job already has {self.max} worker(s) "
                              f"(BYTEPS_MAX_WORKERS / --max-workers {self.max})")
        if self.short_since is not None and now - self.short_since > self.timeout:
            lost = "; ".join(self.lost.values()) or "none lost in this epoch"
            self.s.fail(f"elastic: only {self._available()} worker(s) for more than "
                        f"{self.timeout:g} s (BYTEPS_ELASTIC_TIMEOUT), fewer than "
                        f"--min-workers {self.min} (BYTEPS_MIN_WORKERS); lost: {lost}; start "
                        f"more workers or lower --min-workers")

    def _available(self) -> int:
        newcomers = sum(1 for w in self.waiting.values() if self.member_of(w) is None)
        return len(self.members()) + newcomers

    # ------------------------------------------------------------------ re-forming
    def maybe_reform(self) -> None:
        """Re-form once every live member has registered again (and there are enough)."""
        if not self.pending:
            return
        s = self.s
        again: dict[bytes, bytes] = {}
        for m in self.members():
            new = next((i for i, w in self.waiting.items() if self._same(w, s.workers[m])), None)
            if new is None:
                return                  # still training, or between LEAVE and REGISTER
            again[m] = new
        newcomers = [i for i in self.waiting if i not in again.values()]
        now = time.monotonic()
        if len(again) + len(newcomers) < self.min:
            if self.short_since is None:
                self.short_since = now
                log.warning("elastic: %d worker(s), fewer than --min-workers %d; waiting up to "
                            "%g s for more", len(again) + len(newcomers), self.min, self.timeout)
            return
        self.short_since = None
        order = [again[m] for m in sorted(again, key=lambda m: s.workers[m]["rank"])]
        order += newcomers
        nid = max([n["node_id"] for n in list(s.servers.values()) + list(s.workers.values())]
                  + [0]) + 1
        workers: dict[bytes, dict] = {}
        hosts: dict[str, dict] = {}
        for rank, ident in enumerate(order):
            info = self.waiting.pop(ident)
            info.update(rank=rank, node_id=nid + rank, last_seen=now)
            workers[ident] = info
            h = hosts.setdefault(info["host_id"], {"local_size": info["local_size"],
                                                   "worker_id": info["worker_id"],
                                                   "order": len(hosts), "slots": {}})
            h["slots"][info["local_rank"]] = info["pid"]
        old = set(s.workers)
        s.workers, s.hosts = workers, hosts
        self.conns = {fd: c for fd, c in self.conns.items()
                      if c[0] in self.waiting or c[0] in self.parked}
        s.exited.difference_update(old)
        s.left.difference_update(old)
        for state in (s.barriers, s.gone, s.joined, s.rejoin, s.early_rejoin):
            state.clear()
        s.join_reset = s.rejoin_since = s.all_left_since = None
        lost = list(self.lost.values())
        self.lost.clear()
        self.formed_gen = self.gen
        self.changes += 1
        s.epoch += 1
        log.info("elastic: group re-formed with %d worker(s) (%d new, %d lost), epoch %d",
                 len(workers), len(newcomers), len(lost), s.epoch)
        s.send_books(list(s.servers) + list(s.workers))

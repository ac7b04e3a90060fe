"""The scheduler's barriers, join() and departures (:class:`Departures`, held by
:class:`byteps.scheduler.Scheduler` as ``departures``): a worker that joins counts as present
in barriers and pushes zeros on the servers; one that leaves without join() fails what waits
on it, named."""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")


class Departures:
    """Barriers, join() and workers leaving within one epoch (docs/fault_tolerance.md).

    It owns that state; the scheduler passes the membership each call needs (``workers``:
    the workers' identities, ``servers``: the servers'), and ``send(ident, op, body)``
    sends a message to a node; ``drops``: the scheduler's log of dropped messages."""

    def __init__(self, send: Callable[[bytes, int, dict], None], drops):
        self.send, self.drops = send, drops
        self.barriers: dict[str, set] = {}    # barrier name -> workers waiting in it
        self.joined: dict[bytes, int] = {}    # worker -> rank, in the order they joined
        self.gone: dict[bytes, str] = {}      # worker that left (shutdown()/exit 0) -> why
        self.members_id = 0
        self.join_reset: tuple | None = None  # (MEMBERS id, servers yet to confirm, last rank)

    def clear(self) -> None:
        """A new epoch (the group re-formed): no barrier, join or departure is pending."""
        self.barriers.clear()
        self.gone.clear()
        self.joined.clear()
        self.join_reset = None

    # ---------------------------------------------------------------- barriers
    def barrier(self, ident: bytes, body: dict, workers: Collection) -> None:
        """Worker ``ident`` entered the barrier ``body["name"]``; release it when every
        worker has (or joined)."""
        name = body.get("name")
        if not isinstance(name, str):
            return self.drops.warn("bad barrier", "name must be a string")
        why = self.gone_reason()
        if why:
            return self.send(ident, Op.BARRIER_DONE, {"name": name, "error": why})
        got = self.barriers.setdefault(name, set())
        got.add(ident)
        if len(got | set(self.joined)) >= len(workers):
            del self.barriers[name]
            for w in got:
                self.send(w, Op.BARRIER_DONE, {"name": name})

    # ---------------------------------------------------------------- join, departures
    def tell_servers(self, servers: Collection, **body) -> int:
        """Send the servers the membership of this epoch (joined ranks, ranks gone)."""
        self.members_id += 1
        body.setdefault("joined", sorted(self.joined.values()))
        body.setdefault("gone", [])
        for ident in servers:
            self.send(ident, Op.MEMBERS, {**body, "id": self.members_id})
        return self.members_id

    def gone_reason(self) -> str | None:
        """Why a collective can never complete: a worker left without join()."""
        for ident, why in self.gone.items():
            if ident not in self.joined:
                return why
        return None

    def worker_gone(self, ident: bytes, node: dict, how: str, workers: Collection,
                    servers: Collection) -> None:
        """A worker of a formed group called shutdown() or exited 0 while others may still
        train: the servers fail rounds it never pushed, pending join()s and barriers fail,
        naming it."""
        if ident in self.gone:
            return
        why = f"{describe(dict(node, role='worker'))} {how}"
        self.gone[ident] = why
        if all(w in self.gone for w in workers):
            return                     # everyone is done: nothing waits (or a re-init)
        log.info("%s", why)
        self.tell_servers(servers, gone=[[node["rank"], why]])
        if ident in self.joined:
            return
        for w in self.joined:
            self.send(w, Op.JOIN_DONE, {"error": f"join() cannot complete: {why} without "
                                                 f"calling join()"})
        for name, got in list(self.barriers.items()):
            for w in got:
                self.send(w, Op.BARRIER_DONE, {"name": name, "error": why})
        self.barriers.clear()

    def join(self, ident: bytes, node: dict, workers: Collection, servers: Collection,
             live_servers: Collection) -> None:
        """A worker ran out of data.  The servers count it as pushing zeros; when every worker
        has joined, they reset their rounds (each of ``live_servers`` confirms with
        MEMBERS_OK) and then every join() returns the last rank."""
        if ident in self.joined or self.join_reset is not None:
            return
        why = self.gone_reason()
        if why:
            return self.send(ident, Op.JOIN_DONE, {"error": f"join() cannot complete: {why} "
                                                            f"without calling join()"})
        self.joined[ident] = node["rank"]
        log.info("%s joined (%d of %d)", describe(dict(node, role="worker")), len(self.joined),
                 len(workers))
        if len(self.joined) < len(workers):
            self.tell_servers(servers)
            for name, got in list(self.barriers.items()):   # joined ranks count as present
                if len(got | set(self.joined)) >= len(workers):
                    del self.barriers[name]
                    for w in got:
                        self.send(w, Op.BARRIER_DONE, {"name": name})
            return
        mid = self.tell_servers(servers, reset=True, joined=[])
        self.join_reset = (mid, set(live_servers), node["rank"])
        if not servers:
            self.join_done()

    def members_ok(self, ident: bytes, body: dict) -> None:
        """Server ``ident`` confirmed a membership message (MEMBERS_OK)."""
        if self.join_reset is None or body.get("id") != self.join_reset[0]:
            return
        self.server_done(ident)

    def server_done(self, ident: bytes) -> None:
        """Server ``ident`` reset its rounds for the pending join, or died (failover): the
        join no longer waits for it."""
        if self.join_reset is None:
            return
        self.join_reset[1].discard(ident)
        if not self.join_reset[1]:
            self.join_done()

    def join_done(self) -> None:
        """Every server has reset its rounds: release every join()."""
        last = self.join_reset[2]
        self.join_reset = None
        for w in self.joined:
            self.send(w, Op.JOIN_DONE, {"last_rank": last})
        self.joined.clear()

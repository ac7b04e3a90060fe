"""The scheduler's barriers, join() and departures (a mixin of
:class:`byteps.scheduler.Scheduler`): a worker that joins counts as present in barriers and
pushes zeros on the servers; one that leaves without join() fails what waits on it, named."""
from __future__ import annotations

import logging

from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.scheduler")


class DeparturesMixin:
    """Barriers, join() and workers leaving; state lives on the Scheduler."""

    # ---------------------------------------------------------------- barriers, exits
    def barrier(self, ident: bytes, body: dict) -> None:
        name = body.get("name")
        if not isinstance(name, str):
            return self.drops.warn("bad barrier", "name must be a string")
        why = self.gone_reason()
        if why:
            return self.send(ident, Op.BARRIER_DONE, {"name": name, "error": why})
        got = self.barriers.setdefault(name, set())
        got.add(ident)
        if len(got | set(self.joined)) >= len(self.workers):
            del self.barriers[name]
            for w in got:
                self.send(w, Op.BARRIER_DONE, {"name": name})

    # ---------------------------------------------------------------- join, departures
    def tell_servers(self, **body) -> int:
        """Send the servers the membership of this epoch (joined ranks, ranks gone)."""
        self.members_id += 1
        body.setdefault("joined", sorted(self.joined.values()))
        body.setdefault("gone", [])
        for ident in self.servers:
            self.send(ident, Op.MEMBERS, {**body, "id": self.members_id})
        return self.members_id

    def gone_reason(self) -> str | None:
        """Why a collective can never complete: a worker left without join()."""
        for ident, why in self.gone.items():
            if ident not in self.joined:
                return why
        return None

    def worker_gone(self, ident: bytes, node: dict, how: str) -> None:
        """A worker called shutdown() or exited 0 while others may still train: the servers
        fail rounds it never pushed, pending join()s and barriers fail, naming it."""
        if ident in self.gone or not self.formed:
            return
        why = f"{describe(dict(node, role='worker'))} {how}"
        self.gone[ident] = why
        if all(w in self.gone for w in self.workers):
            return                     # everyone is done: nothing waits (or a re-init)
        log.info("%s", why)
        self.tell_servers(gone=[[node["rank"], why]])
        if ident in self.joined:
            return
        for w in self.joined:
            self.send(w, Op.JOIN_DONE, {"error": f"join() cannot complete: {why} without "
                                                 f"calling join()"})
        for name, got in list(self.barriers.items()):
            for w in got:
                self.send(w, Op.BARRIER_DONE, {"name": name, "error": why})
        self.barriers.clear()

    def join(self, ident: bytes, node: dict) -> None:
        """A worker ran out of data.  The servers count it as pushing zeros; when every worker
        has joined, they reset their rounds and then every join() returns the last rank."""
        if ident in self.joined or self.join_reset is not None:
            return
        why = self.gone_reason()
        if why:
            return self.send(ident, Op.JOIN_DONE, {"error": f"join() cannot complete: {why} "
                                                            f"without calling join()"})
        self.joined[ident] = node["rank"]
        log.info("%s joined (%d of %d)", describe(dict(node, role="worker")), len(self.joined),
                 len(self.workers))
        if len(self.joined) < len(self.workers):
            self.tell_servers()
            for name, got in list(self.barriers.items()):   # joined ranks count as present
                if len(got | set(self.joined)) >= len(self.workers):
                    del self.barriers[name]
                    for w in got:
                        self.send(w, Op.BARRIER_DONE, {"name": name})
            return
        mid = self.tell_servers(reset=True, joined=[])
        self.join_reset = (mid, set(self.servers) - self.exited, node["rank"])
        if not self.servers:
            self.join_done()

    def members_ok(self, ident: bytes, body: dict) -> None:
        if self.join_reset is None or body.get("id") != self.join_reset[0]:
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

    def node_exit(self, ident: bytes, node: dict, body: dict) -> None:
        self.exited.add(ident)
        if body.get("ok") is not True:
            self.fail(f"{describe(node)} exited with an error: {body.get('reason', 'unknown')}",
                      dead=node)
            return
        if ident in self.workers:
            self.worker_gone(ident, node, "exited (code 0)")
        if all(w in self.exited for w in self.workers):
            log.info("all workers exited; ending the job")
            self.broadcast(Op.TERMINATE, {"ok": True, "reason": "all workers finished"})
            self.exit_code = 0

"""Keys that no worker uses any more, freed (``FREE``; docs/scaling.md, "Autotune").

Autotune tries several partition sizes; a tensor whose cut changes gets a new key (the
name's key with the size mixed in), so a server would keep the declaration, slots and
buffers of every size tried.  Once autotune has made its final choice, each worker sends
``FREE {keys}`` (``wire.free_body``) to every server for the keys it left behind, after its
own last use of each (no handle of it in flight: byteps/core/autotune/retire.py).

A server frees a key only when

* it holds the key's declaration (declared by this job; keys it does not hold are
  ignored),
* every pushing rank still in the job asked for it (a vote per rank: then no worker
  pushes it again, and each had its results of every round before asking), and
* no round of it is in flight here (a partial round, a pull waiting, a finished round
  some rank has not pulled, a result waiting for the backup's confirmation) and it is not
  an asynchronous key (the servers hold its value): otherwise the key is kept (a warning,
  counted) -- nothing is lost, at worst memory is not returned.

Freed: the declaration, the slots with their round state, result and double buffers, the
shared-memory result segments (unlinked), the mappings of the workers' push segments,
the replication bookkeeping.  With ``BYTEPS_SERVER_REPLICAS=1`` a backup frees its copies
the same way: the workers send ``FREE`` to every server, so the backup counts the same
votes (copies are finished rounds that nobody pulls: never in flight).

:class:`KeyRetirement` owns the votes and the counts; :class:`byteps.server.Server` keeps one
as ``retire`` (it frees through the server's ``tensors``).
"""
from __future__ import annotations

import logging

from byteps.transport.wire import WireError, free_body

log = logging.getLogger("byteps.server")


class KeyRetirement:
    """FREE votes and the freeing of keys; runs on the server's I/O thread."""

    def __init__(self, srv):
        self.srv = srv                      # byteps.server.Server
        self.free_votes: dict[int, set] = {}   # key -> ranks that asked to free it
        self.keys_freed = 0        # keys freed (metrics, the exit report)
        self.free_refused = 0      # keys every rank asked for but kept (a round in flight)

    def new_book(self) -> None:
        """The ranks of a new address book vote again."""
        self.free_votes.clear()

    def on_free(self, w: dict, body) -> None:
        """A worker's FREE: count its vote for each declared key; free those every
        pushing rank asked for."""
        srv = self.srv
        try:
            keys = free_body(body)
        except WireError as exc:
            return srv.drops.warn("bad FREE", f"from rank {w['rank']}: {exc}")
        need = set(srv.pushers) - set(srv.gone)
        ready = []
        for k in keys:
            d = srv.tensors.decls.get(k)
            if d is None or "shape" not in d or d.get("error"):
                continue        # not held here (or an error kept for the workers to see)
            votes = self.free_votes.setdefault(k, set())
            votes.add(w["rank"])
            if votes >= need:
                ready.append(k)
        if ready:
            self.free_keys(ready)

    def free_keys(self, keys: list) -> None:
        """Free the keys that have no round in flight; keep (and name) the others."""
        srv, tensors = self.srv, self.srv.tensors
        wanted = set(keys)
        by_key: dict = {}
        for kp, slot in list(tensors.slots.items()):
            if kp[0] in wanted:
                by_key.setdefault(kp[0], []).append(slot)
        freed, nslots, nbytes, names = 0, 0, 0, []
        with srv.lock:
            for k in keys:
                slots = by_key.get(k, [])
                why = self.key_busy(k, slots)
                name = tensors.decls[k].get("name", k)
                if why:
                    self.free_refused += 1
                    self.free_votes.pop(k, None)     # asked again at a later boundary
                    log.warning("server %s keeps tensor %r (key %d) that every worker asked "
                                "to free: %s", srv.address, name, k, why)
                    continue
                for slot in slots:
                    nbytes += self.drop_slot(slot)
                nslots += len(slots)
                del tensors.decls[k]
                self.free_votes.pop(k, None)
                srv.replica.forget(k)
                freed += 1
                names.append(name)
        self.keys_freed += freed
        if freed:
            log.info("server %s freed %d key(s) no worker uses any more (autotune's other "
                     "partition sizes): %d partition slot(s), %d bytes of buffers; tensors %s",
                     srv.address, freed, nslots, nbytes,
                     ", ".join(repr(n) for n in sorted(set(names), key=str)[:8])
                     + (" ..." if len(set(names)) > 8 else ""))

    def key_busy(self, key: int, slots: list) -> str | None:
        """Why ``key`` cannot be freed now (a round in flight, an asynchronous value), or
        None."""
        for slot in slots:
            if slot.value is not None or slot.applied:
                return "it is an asynchronous key (the servers hold its value)"
            for rnd, rs in list(slot.rounds.items()):
                if rs.result is None and (rs.ranks or rs.waiting):
                    return (f"round {rnd} of partition {slot.part} is in flight (pushed by "
                            f"rank(s) {sorted(rs.ranks)})")
                if rs.result is not None and rs.ranks and \
                        len(rs.pulled | self.srv.joined) < self.srv.nworkers:
                    return (f"round {rnd} of partition {slot.part} was not pulled by every "
                            f"worker yet")
            if self.srv.replica.in_flight(key, slot.part):
                return (f"a result of partition {slot.part} waits for the backup server's "
                        f"confirmation")
        return None

    def drop_slot(self, slot) -> int:
        """Forget one partition slot and the mappings of the workers' push segments of it;
        returns the bytes of buffers it held."""
        held = self.srv.tensors.drop(slot)
        maps = self.srv.push_maps
        for k in [k for k in maps if k[1] == slot.key and k[2] == slot.part]:
            del maps[k]
        return held

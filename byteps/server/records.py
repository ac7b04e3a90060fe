"""What a server counts and records for tests and logs: the pushed bytes per host and,
with ``BYTEPS_TEST_RECORD``, every push and the counters (bytes, per tensor as they
travelled, the tensor keys held and freed) as files.

:class:`Records` is a base of :class:`byteps.server.Server` (it uses its ``record``,
``decls``, byte counters and ``async_store``).
"""
from __future__ import annotations

import json
import logging
import os

from byteps.transport.wire import COMP, DTYPES, Entry

log = logging.getLogger("byteps.server")


class Records:
    """Push records and byte reports of a server."""

    def record_push(self, rank: int, e: Entry) -> None:
        name = self.decls[e.key]['name']
        with open(self.record, "a") as f:
            f.write(f"{rank} {name} {e.part} {e.round}\n")
        # the payload bytes per tensor as they travelled (a compressed push: its frame)
        slot = self.slots.get((e.key, e.part))
        nbytes = slot.pipe.frame_bytes if e.flags & COMP and slot is not None and \
            slot.pipe is not None else e.length * DTYPES[e.dtype].itemsize
        by_key = self.__dict__.setdefault("bytes_by_tensor", {})
        by_key[name] = by_key.get(name, 0) + nbytes

    def report_bytes(self) -> None:
        """Log the pushed payload bytes per host; with BYTEPS_TEST_RECORD also write them
        to ``<record>.bytes.<pid>.json`` (used by the local-reduction tests)."""
        held = sorted([k, d["name"]] for k, d in self.decls.items() if "shape" in d)
        log.info("server %s received %d payload bytes: %s; holds %d tensor key(s), %d freed "
                 "(FREE, byteps/server/retire.py)", self.address, self.bytes_received,
                 self.bytes_by_host, len(held), self.keys_freed)
        if self.record:
            try:
                with open(f"{self.record}.bytes.{os.getpid()}.json", "w") as f:
                    json.dump({"total": self.bytes_received, "by_host": self.bytes_by_host,
                               "push_count": self.nworkers, "wire_total": self.wire_received,
                               "keys": held, "keys_freed": self.keys_freed,
                               "free_refused": self.free_refused,
                               "replica_stored": self.replica.stats["stored"],
                               "by_tensor": self.__dict__.get("bytes_by_tensor", {})}, f)
            except OSError as exc:
                log.warning("cannot write the byte count: %s", exc)
            if self.async_store.stats["pushes"]:
                try:
                    with open(f"{self.record}.staleness.{os.getpid()}.json", "w") as f:
                        json.dump(self.async_store.stats, f)
                except OSError as exc:
                    log.warning("cannot write the staleness counters: %s", exc)

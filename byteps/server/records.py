"""What a server counts and records for tests and logs: the pushed bytes per host and,
with ``BYTEPS_TEST_RECORD``, every push and the counters (bytes, per tensor as they
travelled, the tensor keys held and freed) as files.

:class:`Records` owns these counters; :class:`byteps.server.Server` keeps one as ``records``
(the report reads the server's declarations, key retirement, replica and ``async_store``).
"""
from __future__ import annotations

import json
import logging
import os

from byteps.transport.wire import COMP, DTYPES, Entry

log = logging.getLogger("byteps.server")


class Records:
    """Push records and byte reports of a server."""

    def __init__(self, srv):
        self.srv = srv                            # byteps.server.Server
        self.record = os.environ.get("BYTEPS_TEST_RECORD")
        self.bytes_received = 0                   # pushed payload bytes
        self.wire_received = 0                    # DATA messages, every frame (headers too)
        self.bytes_by_host: dict[str, int] = {}   # pushed payload bytes per worker host
        self.bytes_by_tensor: dict[str, int] = {}   # with a record: as they travelled

    def pushed(self, w: dict, e: Entry, nbytes: int) -> None:
        """Count one push of ``nbytes`` payload bytes from worker ``w``."""
        self.bytes_received += nbytes
        hid = w.get("host_id") or "?"
        self.bytes_by_host[hid] = self.bytes_by_host.get(hid, 0) + nbytes
        if self.record:
            self.record_push(w["rank"], e)

    def record_push(self, rank: int, e: Entry) -> None:
        name = self.srv.decls[e.key]['name']
        with open(self.record, "a") as f:
            f.write(f"{rank} {name} {e.part} {e.round}\n")
        # the payload bytes per tensor as they travelled (a compressed push: its frame)
        slot = self.srv.slots.get((e.key, e.part))
        nbytes = slot.pipe.frame_bytes if e.flags & COMP and slot is not None and \
            slot.pipe is not None else e.length * DTYPES[e.dtype].itemsize
        by_key = self.bytes_by_tensor
        by_key[name] = by_key.get(name, 0) + nbytes

    def report(self) -> None:
        """Log the pushed payload bytes per host; with BYTEPS_TEST_RECORD also write them
        to ``<record>.bytes.<pid>.json`` (used by the local-reduction tests)."""
        srv = self.srv
        held = sorted([k, d["name"]] for k, d in srv.decls.items() if "shape" in d)
        log.info("server %s received %d payload bytes: %s; holds %d tensor key(s), %d freed "
                 "(FREE, byteps/server/retire.py)", srv.address, self.bytes_received,
                 self.bytes_by_host, len(held), srv.retire.keys_freed)
        if self.record:
            try:
                with open(f"{self.record}.bytes.{os.getpid()}.json", "w") as f:
                    json.dump({"total": self.bytes_received, "by_host": self.bytes_by_host,
                               "push_count": srv.nworkers, "wire_total": self.wire_received,
                               "keys": held, "keys_freed": srv.retire.keys_freed,
                               "free_refused": srv.retire.free_refused,
                               "replica_stored": srv.replica.stats["stored"],
                               "by_tensor": self.bytes_by_tensor}, f)
            except OSError as exc:
                log.warning("cannot write the byte count: %s", exc)
            if srv.async_store.stats["pushes"]:
                try:
                    with open(f"{self.record}.staleness.{os.getpid()}.json", "w") as f:
                        json.dump(srv.async_store.stats, f)
                except OSError as exc:
                    log.warning("cannot write the staleness counters: %s", exc)

"""Stall reports of a server: rounds waiting for pushes longer than
BYTEPS_STALL_WARNING_S (naming the missing ranks and hosts) and, with bounded
staleness, pulls held for slow ranks.

:class:`StallReports` is kept by :class:`byteps.server.Server` as ``stalls``; it reads the
server's rounds, declarations and membership, and counts the reports it sent.
"""
from __future__ import annotations

import logging

from byteps.common.node import describe
from byteps.transport.wire import Op

log = logging.getLogger("byteps.server")


class StallReports:
    """The server's stall inspector (runs on its I/O thread once a second)."""

    def __init__(self, srv):
        self.srv = srv      # byteps.server.Server
        self.sent = 0       # STALL messages sent (metrics)

    def scan(self, now: float) -> None:
        srv = self.srv
        if srv.async_store.held:
            self.scan_held(now)
        warn, kill = srv.cfg.stall_warning_s, srv.cfg.stall_shutdown_s
        reports: dict = {}
        for slot in list(srv.slots.values()):
            for rnd, rs in list(slot.rounds.items()):
                if rs.result is not None or not rs.ranks:
                    continue
                age = now - rs.started
                if age < warn or (rs.warned and not (kill and age >= kill)):
                    continue
                name = srv.decls.get(slot.key, {}).get("name", slot.key)
                missing = [w for w in srv.workers_by_id.values()
                           if w["rank"] not in rs.ranks and w["rank"] not in srv.joined]
                if srv.local_reduce != "off":    # one push per host: name the missing hosts
                    done = {w.get("host_id") for w in srv.workers_by_id.values()
                            if w["rank"] in rs.ranks}
                    missing = [w for w in missing if w.get("host_id") not in done
                               and w.get("local_rank") == 0]
                fatal = bool(kill and age >= kill)
                if fatal:
                    rs.started = now  # report once per period
                elif rs.warned:
                    continue
                rs.warned = True
                # one report per tensor and round, not one per partition
                k = (fatal, name, rnd, tuple(sorted(rs.ranks)),
                     ", ".join(describe(m) for m in missing))
                parts = reports.setdefault(k, [0, age, sorted(m["rank"] for m in missing)])
                parts[0] += 1
                parts[1] = max(parts[1], age)
        for (fatal, name, rnd, ranks, missing), (nparts, age, owe) in reports.items():
            text = (f"tensor {name!r} ({nparts} partition(s), round {rnd}) waited {age:.0f} s: "
                    f"pushed by rank(s) {list(ranks)}, missing {missing}")
            if not fatal:
                log.warning("stall: %s", text)
            srv.link.send(Op.STALL, {"text": text, "fatal": fatal, "tensor": str(name)[:400],
                                      "round": rnd, "age": round(age, 1), "missing": owe})
            self.sent += 1

    def scan_held(self, now: float) -> None:
        """Bounded staleness: report pulls held longer than BYTEPS_STALL_WARNING_S,
        naming the slow rank(s) they wait for (once per tensor and period)."""
        srv = self.srv
        reports: dict = {}
        for key, part, rank, rnd, age, low, slow in srv.async_store.waiting(
                srv.slots, srv.async_ranks(), srv.cfg.stall_warning_s, now):
            name = srv.decls.get(key, {}).get("name", key)
            k = (name, tuple(slow), low)
            reports.setdefault(k, [set(), 0.0])
            reports[k][0].add((rank, rnd))
            reports[k][1] = max(reports[k][1], age)
        for (name, slow, low), (waiters, age) in reports.items():
            if srv.async_store.reported == (name, slow, low):
                continue
            srv.async_store.reported = (name, slow, low)
            who = ", ".join(describe(srv.workers_by_id[n]) for n in srv.workers_by_id
                            if srv.workers_by_id[n]["rank"] in slow)
            text = (f"tensor {name!r}: pulls of rank(s) {sorted({r for r, _ in waiters})} "
                    f"held {age:.0f} s by BYTEPS_ASYNC_STALENESS={srv.async_store.staleness}: "
                    f"waiting for the slow rank(s) {list(slow)} ({who}) at round {low}")
            log.warning("stall: %s", text)
            srv.link.send(Op.STALL, {"text": text, "fatal": False})
            self.sent += 1

"""The end-of-job line per worker that ``bpslaunch`` prints: the worker writes
``worker<rank>.json`` into the launcher's folder (``BPSLAUNCH_SUMMARY_DIR``) at shutdown
(:func:`write_summary`), and the launcher prints each with :func:`format_summary`.
Both sides live here, so the launcher never imports the worker.
"""
from __future__ import annotations

import json
import logging
import os

log = logging.getLogger("byteps.timeline")


def write_summary(speed, rank: int, host: str, traffic: dict | None = None) -> str | None:
    """Write this worker's one-line summary for ``bpslaunch`` (if it asked for one);
    ``speed`` is the worker's :class:`byteps.core.timeline.PushPullSpeed` (its
    ``summary()`` dict); ``traffic``: bytes ``pushed``/``pulled`` raw and ``pushed_wire``/
    ``pulled_wire`` as sent and received, after compression (``Compression.totals()``)."""
    d = os.environ.get("BPSLAUNCH_SUMMARY_DIR")
    if not d or not os.path.isdir(d):
        return None
    path = os.path.join(d, f"worker{rank}.json")
    doc = dict(speed.summary(), **(traffic or {}), rank=rank, host=host, pid=os.getpid())
    _add_earlier(doc, path)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.debug("cannot write the summary %s: %s", path, exc)
        return None
    return path


#: what a process's summaries of several init()...shutdown() cycles add up
_SUMMED = ("push_pulls", "bytes", "active_s", "pushed", "pushed_wire", "pulled", "pulled_wire")


def _add_earlier(doc: dict, path: str) -> None:
    """The same process's summary of an earlier init() (shutdown() and init() again,
    ``suspend()``/``resume()``, an elastic reset) is added in: the launcher reports the
    whole process, not its last cycle."""
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(old, dict) or old.get("pid") != doc["pid"]:
        return
    for k in _SUMMED:
        if isinstance(old.get(k), (int, float)) and k in doc:
            doc[k] += old[k]
    doc["avg_MBps"] = round(doc["bytes"] / doc["active_s"] / 1e6, 3) if doc["active_s"] else 0.0


def format_summary(doc: dict) -> str:
    """One line for a worker summary written by :func:`write_summary`; with compression,
    the bytes on the wire next to the raw bytes."""
    line = (f"bpslaunch: worker rank {doc.get('rank')} (host {doc.get('host')}): "
            f"{doc.get('push_pulls', 0)} push_pull(s), {doc.get('bytes', 0) / 1e6:.1f} MB pushed "
            f"and pulled, first to last result {doc.get('active_s', 0.0):.2f} s, "
            f"{doc.get('avg_MBps', 0.0):.1f} MB/s")
    return line + wire_text(doc)


def wire_text(doc: dict) -> str:
    """``; compressed: ... on the wire`` when compression changed this worker's traffic
    (``doc``: the byte counts of :func:`write_summary`), else ""."""
    raw = doc.get("pushed", 0) + doc.get("pulled", 0)
    wire = doc.get("pushed_wire", raw) + doc.get("pulled_wire", raw)
    if not raw or wire == raw:
        return ""
    return (f"; compressed: {doc.get('pushed_wire', 0) / 1e6:.2f} MB on the wire for "
            f"{doc.get('pushed', 0) / 1e6:.2f} MB pushed, {doc.get('pulled_wire', 0) / 1e6:.2f}"
            f" MB for {doc.get('pulled', 0) / 1e6:.2f} MB pulled ({raw / max(wire, 1):.1f}x "
            f"less)")

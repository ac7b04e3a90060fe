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


def write_summary(speed, rank: int, host: str) -> str | None:
    """Write this worker's one-line summary for ``bpslaunch`` (if it asked for one);
    ``speed`` is the worker's :class:`byteps.core.timeline.PushPullSpeed` (its
    ``summary()`` dict)."""
    d = os.environ.get("BPSLAUNCH_SUMMARY_DIR")
    if not d or not os.path.isdir(d):
        return None
    path = os.path.join(d, f"worker{rank}.json")
    doc = dict(speed.summary(), rank=rank, host=host, pid=os.getpid())
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.debug("cannot write the summary %s: %s", path, exc)
        return None
    return path


def format_summary(doc: dict) -> str:
    """One line for a worker summary written by :func:`write_summary`."""
    return (f"bpslaunch: worker rank {doc.get('rank')} (host {doc.get('host')}): "
            f"{doc.get('push_pulls', 0)} push_pull(s), {doc.get('bytes', 0) / 1e6:.1f} MB pushed "
            f"and pulled, first to last result {doc.get('active_s', 0.0):.2f} s, "
            f"{doc.get('avg_MBps', 0.0):.1f} MB/s")

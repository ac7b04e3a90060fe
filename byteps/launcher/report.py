"""What bpslaunch says about its workers once they ended: each worker's one-line summary
(byteps.common.summary) and where the timelines of a trace run are."""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys

from byteps.common import variables
from byteps.launcher.supervise import say


def print_summaries(folder: str, failed: bool = False) -> None:
    """Print the one-line summary each worker left in ``folder``; remove it."""
    docs = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                doc = json.load(f)
            if isinstance(doc, dict):
                docs.append(doc)
        except (OSError, ValueError):
            pass
    print_summary_docs(docs, failed)
    shutil.rmtree(folder, ignore_errors=True)


def print_summary_docs(docs: list[dict], failed: bool = False) -> None:
    """The summaries (plain data written by the workers), by rank; in a job that
    ``failed``, the workers without a completed push_pull share one line."""
    from byteps.common.summary import format_summary
    docs = sorted(docs, key=lambda d: d["rank"] if isinstance(d.get("rank"), int) else -1)
    idle = [str(d.get("rank")) for d in docs if failed and not d.get("push_pulls")]
    for doc in docs:
        if doc.get("push_pulls") or not failed:
            print(format_summary(doc), file=sys.stderr, flush=True)
    if idle:      # one line, not one zero line per worker (a job that failed at once)
        print(f"bpslaunch: worker rank(s) {', '.join(idle)}: no push_pull completed",
              file=sys.stderr, flush=True)


def trace_note(env, elsewhere: str = "") -> None:
    """With BYTEPS_TRACE_ON=1: say where the workers wrote their timelines (relative
    BYTEPS_TRACE_DIR: from bpslaunch's working directory, the workers'); ``elsewhere``
    names hosts whose files are on their own disks."""
    try:
        if not variables.value("BYTEPS_TRACE_ON", env):
            return
        where = os.path.abspath(variables.value("BYTEPS_TRACE_DIR", env))
    except ValueError:              # reported by the configuration check already
        return
    files = glob.glob(os.path.join(glob.escape(where), "*", "comm.json"))
    there = f"; on {elsewhere}: the same path there" if elsewhere else ""
    if files:
        say(f"timeline: {len(files)} trace file(s) in {where}/<rank>/comm.json{there} "
            f"(open them in ui.perfetto.dev or chrome://tracing; docs/timeline.md)")
    else:
        say(f"timeline: BYTEPS_TRACE_ON=1 but no trace file in {where}/<rank>/comm.json"
            f"{there} (steps BYTEPS_TRACE_START_STEP..BYTEPS_TRACE_END_STEP are recorded; "
            f"a step is counted by the framework plugins' optimizers)")

"""``bpslaunch --dashboard [PORT]``: the scheduler serves the live dashboard
(byteps/dashboard, docs/dashboard.md) through ``BYTEPS_DASHBOARD_PORT``.

Standalone: the port (a free one when PORT is left out) goes into the scheduler's
environment and bpslaunch prints the ready URL (with the token derived from the job
secret).  ``-H`` and ``--slurm``: the variable is passed to every process like any
``BYTEPS_*`` variable; the scheduler logs the URL on its host.  ``bpslaunch --stacks URL``
prints every worker's Python stacks from a running job's dashboard.
"""
from __future__ import annotations

import os

HELP = ("serve the live dashboard from the scheduler on PORT (default: a free port): every "
        "rank's step, compute/communication split and throughput, servers, stalls with the "
        "stuck line of code, stragglers; bpslaunch prints the URL (docs/dashboard.md)")
SAID = "BPSLAUNCH_DASHBOARD_SAID"        # bpslaunch printed the URL: the scheduler need not


def add_argument(ap) -> None:
    ap.add_argument("--dashboard", nargs="?", const=0, type=int, default=None, metavar="PORT",
                    help=HELP)
    ap.add_argument("--stacks", metavar="URL", default=None,
                    help="print the Python stacks of every worker of a running job whose "
                         "dashboard is at URL (the URL bpslaunch printed, with its token)")


def print_stacks(url: str) -> int:
    """``bpslaunch --stacks URL``: every worker's stacks, from the job's dashboard."""
    import json
    import sys
    import urllib.error
    import urllib.parse
    import urllib.request
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.netloc:
        print(f"bpslaunch: --stacks {url!r}: give the dashboard's URL, "
              f"http://HOST:PORT/?token=...", file=sys.stderr)
        return 2
    api = urllib.parse.urlunsplit(("http", parts.netloc, "/api/stacks", parts.query, ""))
    try:
        with urllib.request.urlopen(api, timeout=30) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"bpslaunch: --stacks: no answer from {parts.netloc}: {exc}", file=sys.stderr)
        return 1
    for rank, info in sorted(doc.items(), key=lambda kv: int(kv[0])):
        head = f"rank {rank} (host {info.get('host')}, pid {info.get('pid')}, {info.get('state')})"
        if not info.get("stacks"):
            print(f"{head}: no stack received")
            continue
        print(f"{head}, {info.get('age_s')} s ago:")
        for name, frames in info["stacks"]:
            print(f"  thread {name}:")
            for f, line, fn in reversed(frames):
                print(f"    {f}:{line} in {fn}()")
    return 0


def fix_argv(argv: list[str], ap) -> list[str]:
    """``--dashboard python train.py``: the option's PORT is optional, so a non-number after
    it is the command, not the port.  Only bpslaunch's own options are looked at (the
    command starts at the first word that is neither an option nor an option's value)."""
    out = list(argv)
    actions = ap._option_string_actions
    i = 0
    while i < len(out):
        a = out[i]
        if a == "--" or not a.startswith("-") or a == "-":
            break
        if a == "--dashboard":
            if i + 1 >= len(out) or not out[i + 1].isdigit():
                out[i] = "--dashboard=0"
            break
        act = actions.get(a.split("=", 1)[0])
        takes = act is not None and act.nargs not in (0, "?", "*") and "=" not in a
        i += 2 if takes else 1
    return out


def check(args, ap) -> None:
    port = getattr(args, "dashboard", None)
    if port is not None and not 0 <= port <= 65535:
        ap.error(f"--dashboard {port}: a port is 0..65535")


def standalone_env(args, base: dict, free_port) -> None:
    """Put the dashboard's port into a standalone job's environment and print its URL."""
    port = getattr(args, "dashboard", None)
    if port is None:
        return
    from byteps.dashboard import url
    from byteps.launcher.supervise import say
    port = port or free_port()
    base.update(BYTEPS_DASHBOARD_PORT=str(port), **{SAID: "1"})
    host = base.get("DMLC_PS_ROOT_URI") or "127.0.0.1"
    say(f"dashboard at {url(host, port, base.get('BYTEPS_JOB_SECRET'))}")


def cluster_env(args) -> None:
    """-H/--slurm: every process gets BYTEPS_DASHBOARD_PORT (the scheduler uses it)."""
    port = getattr(args, "dashboard", None)
    if port is not None:
        os.environ["BYTEPS_DASHBOARD_PORT"] = str(port)

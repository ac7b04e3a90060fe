"""``python -m byteps.ray._child MODULE``: run ``python -m MODULE`` that dies with the
actor that started it (PR_SET_PDEATHSIG set here, after exec: a ``preexec_fn`` is unsafe
in a Ray actor's process, which has many threads)."""
from __future__ import annotations

import os
import runpy
import sys

from byteps.launcher.supervise import _pdeathsig

PARENT_VAR = "BPSRAY_PARENT_PID"


def main() -> None:
    _pdeathsig()
    parent = os.environ.pop(PARENT_VAR, None)
    if parent is not None and os.getppid() != int(parent):
        sys.exit(1)                      # the actor died before prctl took effect
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

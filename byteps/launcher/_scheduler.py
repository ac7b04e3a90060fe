"""The scheduler as ``bpslaunch --standalone`` runs it: ``python -m byteps.launcher._scheduler``.

The same scheduler, which also leaves the reason it gave for ending a failed job
in ``$BPSLAUNCH_STATUS_DIR`` so that bpslaunch can name it in its last line.
"""
from __future__ import annotations

import logging
import sys

from byteps.common.node import leave_reason


class _Reason(logging.Handler):
    """Keeps the scheduler's first 'ending the job: ...' error (else its first error)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.ending: str | None = None
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:
            return
        if msg.startswith("ending the job: ") and self.ending is None:
            self.ending = msg[len("ending the job: "):]
            leave_reason(self.ending)        # now: bpslaunch may end this process soon
        elif self.first is None:
            self.first = msg


def main() -> int:
    from byteps.scheduler import main as scheduler_main
    reason = _Reason()
    logging.getLogger("byteps.scheduler").addHandler(reason)
    code = 1
    try:
        code = scheduler_main()
    finally:
        if code and reason.ending is None and reason.first:
            leave_reason(reason.first)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Logging set-up from BYTEPS_LOG_LEVEL, with the role in every line."""
from __future__ import annotations

import logging
import os
import sys

_DONE = False


def setup_logging(cfg, role: str) -> None:
    """Configure the ``byteps`` logger once per process."""
    global _DONE
    logger = logging.getLogger("byteps")
    logger.setLevel(cfg.log_level)
    if _DONE:
        return
    _DONE = True
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(
        f"[%(asctime)s] byteps {role} pid {os.getpid()} %(levelname)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(h)
    logger.propagate = False

"""Import MXNet once for the plugin, keeping torch's thread count.

Importing mxnet lowers the OpenMP thread count that torch uses in the same
process (both link an OpenMP runtime); if torch is already loaded, its
``get_num_threads()`` is restored afterwards.
"""
from __future__ import annotations

import sys


def _import_mxnet():
    torch = sys.modules.get("torch")
    threads = None
    if torch is not None and hasattr(torch, "get_num_threads"):
        threads = torch.get_num_threads()
    try:
        import mxnet
    except ImportError as exc:
        raise ImportError(
            f"byteps.mxnet needs mxnet ({exc}). MXNet 1.9.1 needs numpy<1.24, so it lives in "
            f"its own environment: `make test-mxnet` builds .venv-mxnet from "
            f"requirements-mxnet.txt (see docs/mxnet.md)") from exc
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return mxnet


mx = _import_mxnet()

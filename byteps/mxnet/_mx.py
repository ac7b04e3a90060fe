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
    except (ImportError, AttributeError) as exc:   # numpy>=1.24: no np.bool (AttributeError)
        from byteps import DIST
        raise ImportError(
            f"byteps.mxnet needs mxnet ({type(exc).__name__}: {exc}). MXNet 1.9.1, its last "
            f"release, imports only with numpy<1.24 (Python <= 3.11), so give it an environment "
            f"of its own: pip install '{DIST}[mxnet]' there (it pins numpy<1.24); in a checkout "
            f"of the project `make test-mxnet` builds .venv-mxnet (see docs/mxnet.md)") from exc
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return mxnet


mx = _import_mxnet()

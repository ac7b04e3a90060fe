"""A tensor name used again with another shape or dtype (Horovod allows it).

A name's first layout (shape and dtype) keeps the name's own key: the servers' check of
that key's declaration is what makes ranks that disagree on a first use fail with an
error naming both ranks.  Any other layout travels under the key of
``<name>#<shape>.<dtype>`` (a new declaration on the servers), so every rank that uses
the name with that layout meets under the same key, whatever it did before and whether
or not it had joined (``join()``) in between: keys follow from the layout only, never
from a per-rank history or counter.

Ranks that use one name with different layouts at the same call after its first use
push to different keys; the servers' stall warnings then name the rank missing from
each (as for any collective one rank never calls).
"""
from __future__ import annotations

import numpy as np


_FIRST: dict[tuple, tuple] = {}    # (job id, name) -> first layout, kept across init()


def current(st, name: str, src: np.ndarray) -> str:
    """The name under which ``src`` travels (see the module docstring).

    The first layouts outlive ``shutdown()``/``init()`` in this process, as the servers'
    declarations outlive a re-formed group of the same job."""
    layout = (tuple(src.shape), src.dtype.str)
    if _FIRST.setdefault((st.cfg.job_id, name), layout) == layout:
        return name
    new = f"{name}#{'x'.join(map(str, src.shape)) or 'scalar'}.{src.dtype.name}"
    if name in st.declared and new not in st.declared:   # compression given to declare()
        st.declared[new] = st.declared[name]
    return new

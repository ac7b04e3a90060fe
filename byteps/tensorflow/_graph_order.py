"""The order of byteps' collectives in TF1 graphs, and which of them a session run needs.

Each collective waits for the other ranks inside a ``numpy_function``, which holds one of
TensorFlow's inter-op threads.  Unordered, two ranks could each start a different
collective first and hold every thread waiting for one the other has not started, so every
byteps op of a TF1 graph gets a control dependency on the one built before it
(:func:`chain_deps`): every rank enters them in the order they were built.

A control dependency also makes a run execute the op it names, so fetching the tenth op
built would run the nine before it again, with their collectives (quadratic in a loop
that builds and evaluates one op at a time).  So ``Session.run`` is wrapped
(:func:`install`): when the session's graph has byteps ops, the run works out, from its
fetches, which byteps ops it needs through data and other control edges (every edge but
the chain's), and feeds a run id through one ``placeholder_with_default`` per graph that
every byteps op reads.  An op that the run executes only for the chain's sake keeps its
place in the order but returns at once, without a collective (its outputs reach nothing
the run fetches).  Every rank that runs the same fetches decides the same.  A run that
does not go through ``Session.run`` (``make_callable``, ``partial_run``), or whose
fetches are not plain graph elements, feeds nothing: the default id, -1, runs every op.
"""
from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np
import tensorflow as tf

_lock = threading.Lock()
_ids = itertools.count()
_runs: dict[int, frozenset] = {}       # run id -> the byteps ops that run needs
NO_RUN = -1


class _GraphOrder:
    """The byteps ops of one TF1 graph: their chain and the run-id placeholder."""

    def __init__(self, graph):
        self.last = None                    # the byteps op built last
        self.pred: dict[str, str] = {}      # op name -> the op it is chained after
        self.ops: set[str] = set()
        self.cache: dict = {}               # (graph version, fetch names) -> needed ops
        # outside any control dependency, loop or cond context (None clears them) and scope
        with graph.as_default(), graph.control_dependencies(None), graph.name_scope(None), \
                tf.device("/cpu:0"):
            self.run_id = tf.compat.v1.placeholder_with_default(np.int64(NO_RUN), [],
                                                                name="BytePSRunId")

    def needed(self, graph, fetches):
        """Names of the byteps ops ``fetches`` need (not through the chain), or None."""
        try:
            flat = tf.nest.flatten(fetches, expand_composites=True)
            roots = []
            for f in flat:
                el = graph.as_graph_element(f, allow_tensor=True, allow_operation=True)
                roots.append(el if isinstance(el, tf.Operation) else el.op)
        except Exception:          # noqa: BLE001 - not plain graph elements: run them all
            return None
        key = (graph.version, tuple(sorted({op.name for op in roots})))
        got = self.cache.get(key)
        if got is not None:
            return got
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            stack.extend(t.op for t in op.inputs)
            pred = self.pred.get(op.name)
            stack.extend(c for c in op.control_inputs if c.name != pred)
        got = frozenset(seen & self.ops)
        if len(self.cache) > 256:
            self.cache.clear()
        self.cache[key] = got
        return got


_graphs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def state(graph) -> _GraphOrder:
    """The graph's byteps ops (created with its run-id placeholder on first use)."""
    with _lock:
        st = _graphs.get(graph)
        if st is None:
            install()
            st = _graphs[graph] = _GraphOrder(graph)
        return st


def chain_deps(graph) -> list:
    """The control dependencies of the next byteps op built in ``graph``."""
    st = state(graph)
    return [] if st.last is None else [st.last]


def built(graph, op) -> None:
    """``op`` (a byteps op just built in ``graph``) is the chain's new last op."""
    st = state(graph)
    if st.last is not None:
        st.pred[op.name] = st.last.name
    st.ops.add(op.name)
    st.last = op


def runs(name: str, run_id) -> bool:
    """Whether the byteps op ``name`` does its collective in the run ``run_id``."""
    rid = int(run_id)
    if rid == NO_RUN:
        return True
    needed = _runs.get(rid)
    return needed is None or name in needed


def install() -> None:
    """Wrap ``Session.run`` once (see the module's docstring); other graphs are untouched."""
    from tensorflow.python.client import session as tf_session
    base = tf_session.BaseSession.run
    if getattr(base, "_byteps_order", False):
        return

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        st = _graphs.get(self.graph)
        needed = None if st is None or st.last is None else st.needed(self.graph, fetches)
        if needed is None:
            return base(self, fetches, feed_dict, options, run_metadata)
        rid = next(_ids)
        feeds = dict(feed_dict or {})
        feeds[st.run_id] = rid
        _runs[rid] = needed
        try:
            return base(self, fetches, feeds, options, run_metadata)
        finally:
            _runs.pop(rid, None)
    run._byteps_order = True              # noqa: SLF001
    run.__doc__, run.__wrapped__ = base.__doc__, base
    tf_session.BaseSession.run = run

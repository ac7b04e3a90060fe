"""``bps.DistributedGradientTape``: a recorded ``tf.GradientTape`` whose ``gradient()``
takes part in distributed training.

* SyncPS (the default): the gradients are averaged over workers (each push_pull starts
  as soon as backpropagation produces it; ``gradient()`` waits once for all).
* Any other core algorithm (``algorithm=``, or ``BYTEPS_ENABLE_ASYNC=1``: AsyncPS): the
  tape only sees gradients, so the algorithm's hooks run on the *variables* among the
  ``sources``, one step late.  ``gradient()`` returns the local gradients (after the
  algorithm's ``reduce_gradients``, a no-op for AsyncPS); before it returns, the
  variables get the algorithm's ``after_step`` for the previous step (AsyncPS: push the
  change since the last pull, which is the previous local update, and assign the pulled
  global value) -- ``init`` on the first call (rank 0's values seed the servers).  The
  user's ``apply_gradients`` then starts from the global value.  No rank waits for
  another: a slow worker does not hold a fast one to its pace.  At the end every rank
  calls :func:`finish` (``tape.finish()``): the last local update is pushed and every
  rank pulls the final value, so all ranks end identical.
* ``optimizer=``: the Keras optimizer that will apply the gradients.  Its current
  learning rate reaches the core's error feedback every step (lr-aware error feedback,
  docs/compression.md), and a ``bps.QAdamOptimizer`` makes ``gradient()`` return what
  QAdam's update expects (averaged gradients during warm-up, then the averaged
  compressed momenta).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from byteps.core import algorithms as _algorithms
from byteps.core import api as core
from byteps.core.collective.rules import is_adasum
from byteps.tensorflow import _ops
from byteps.tensorflow.compression import Compression, report_lr, with_params

PREFIX = "DistributedGradientTape.Push_Pull."
_RUNS: dict[tuple, "_TapeRun"] = {}      # one per variable list, in order of first use


class _TapeRun:
    """A core algorithm running on one list of variables across the steps' tapes."""

    def __init__(self, algorithm, names: list[str], variables: list):
        self.algorithm, self.names, self.variables = algorithm, names, variables
        self.started = False

    def _arrays(self) -> dict:
        return {n: np.array(v.numpy(), order="C", copy=True)
                for n, v in zip(self.names, self.variables)}

    def _write(self, arrs: dict) -> None:
        for n, v in zip(self.names, self.variables):
            v.assign(arrs[n])

    def step(self) -> int:
        """``init`` on the first call, else ``after_step`` for the previous step."""
        arrs = self._arrays()
        if not self.started:
            self.algorithm.init(arrs)
            self.started = True
        else:
            self.algorithm.after_step(arrs)
            core.step_done()
        self._write(arrs)
        return 0

    def reduce(self, names: list[str], grads: list) -> list:
        """The algorithm's ``reduce_gradients`` on dense numpy gradients (in place)."""
        d = {n: np.array(g, order="C", copy=True) for n, g in zip(names, grads)}
        self.algorithm.reduce_gradients(d)
        return [d[n] for n in names]

    def finish(self) -> None:
        if not self.started:
            return
        arrs = self._arrays()
        self.algorithm.after_step(arrs)       # the last local update
        self.algorithm.finish(arrs)
        self._write(arrs)
        self.started = False


def finish() -> None:
    """End of training for every tape that ran a core algorithm (AsyncPS, ...): push the
    last local update and take the algorithm's final value, so every rank ends with
    identical variables.  Every rank calls it, eagerly, after its last step."""
    for run in list(_RUNS.values()):
        run.finish()
    _RUNS.clear()


def _adasum_grads(grads: list, sources: list, process_set) -> list:
    """Horovod's tape with op=Adasum: every gradient combined with Adasum (sparse ones as
    dense), one grouped allreduce; ``None`` stays ``None``."""
    from byteps.tensorflow import mpi_ops
    idx = [i for i, g in enumerate(grads) if g is not None]
    if not idx:
        return list(grads)
    names = _ops.unique_names(PREFIX, sources)
    outs = mpi_ops.grouped_allreduce([tf.convert_to_tensor(grads[i]) for i in idx],
                                     op=mpi_ops.Adasum, process_set=process_set,
                                     name=f"{names[idx[0]]}.adasum{len(idx)}")
    out = list(grads)
    for i, o in zip(idx, outs):
        out[i] = o
    return out


def _algorithm(algorithm, compression):
    """The non-SyncPS core algorithm the tape runs, or None for the gradient exchange."""
    if algorithm is None:
        if not (core.is_initialized() and core.get_config().enable_async):
            return None
    algorithm = _algorithms.resolve(algorithm, "DistributedGradientTape")
    if algorithm.plugin_gradients:
        return None
    bind = getattr(algorithm, "bind", None)
    params = getattr(compression, "core_params", None)
    if bind is not None:
        bind(params, 1, subject=f"DistributedGradientTape with {algorithm.describe()}")
    return algorithm


def _is_variable(s) -> bool:
    """A tf.Variable or a Keras 3 variable (not a tf.Variable subclass)."""
    return isinstance(s, tf.Variable) or (hasattr(s, "assign") and hasattr(s, "numpy"))


def _key(source):
    """A hashable identity of a variable (tf.Variable.ref(); a Keras 3 variable has none)."""
    ref = getattr(source, "ref", None)
    return ref() if callable(ref) else id(source)


def _after(tensors: list, op) -> list:
    """``tensors`` (gradients, None or IndexedSlices) ordered after ``op``."""
    out = []
    with tf.control_dependencies([op]):
        for g in tensors:
            if g is None:
                out.append(None)
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape))
            else:
                out.append(tf.identity(g))
    return out


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape whose ``gradient()`` takes part in distributed training."""

    def __init__(self, tape, device_dense, device_sparse, compression, sparse_as_dense, op,
                 algorithm, optimizer, persistent=False, watch_accessed_variables=True,
                 scale_local_gradients=True, process_set=None):
        super().__init__(persistent, watch_accessed_variables)
        self._tape = tape._tape                 # share what the user's tape recorded
        self._bps = (device_dense, device_sparse, compression, sparse_as_dense, op)
        self._bps_alg, self._bps_opt = algorithm, optimizer
        self._bps_local: dict = {}              # key -> source (kept alive: its key is its id)
        self._bps_scale_local = scale_local_gradients
        self._bps_process_set = process_set

    def register_local_source(self, source) -> None:
        """Horovod's: ``source``'s gradient stays this worker's own (no exchange), divided
        by the number of workers unless ``scale_local_gradients=False``."""
        self._bps_local[_key(source)] = source

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat, srcs = tf.nest.flatten(grads), tf.nest.flatten(sources)
        if not self._bps_local:
            return tf.nest.pack_sequence_as(grads, self._reduce(flat, srcs))
        glob = [i for i, s in enumerate(srcs) if _key(s) not in self._bps_local]
        out = list(flat)
        for i, g in zip(glob, self._reduce([flat[i] for i in glob], [srcs[i] for i in glob])):
            out[i] = g
        n = float(_ops.reducing_size(self._bps_process_set))
        for i in set(range(len(srcs))) - set(glob):
            g = out[i]
            if g is not None and self._bps_scale_local:
                out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape) \
                    if isinstance(g, tf.IndexedSlices) else g / n
        return tf.nest.pack_sequence_as(grads, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, **kw):
        """Horovod's: ``(local, global)`` lists of (source, gradient) pairs."""
        grads = self.gradient(target, sources, output_gradients, **kw)
        pairs = list(zip(tf.nest.flatten(sources), tf.nest.flatten(grads)))
        return ([p for p in pairs if _key(p[0]) in self._bps_local],
                [p for p in pairs if _key(p[0]) not in self._bps_local])

    def _reduce(self, flat: list, srcs: list) -> list:
        dd, ds, comp, sad, op = self._bps
        if op == _ops.Adasum:                     # Horovod's tape: the gradients' Adasum
            reduced = _adasum_grads(flat, srcs, self._bps_process_set)
        elif self._bps_alg is not None:
            reduced = self._algorithm_step(flat, srcs)
        else:
            exchange = getattr(self._bps_opt, "_bps_exchange", None)
            report_lr(self._bps_opt, getattr(comp, "core_params", None),
                      getattr(self._bps_opt, "compression_params", None) if exchange else None)
            if exchange is not None:             # QAdam: gradients, then momenta
                from byteps._keras import _Settings
                st = _Settings(PREFIX, comp, sad, op, dd, ds, 1, False)
                st.process_set = self._bps_process_set
                reduced = exchange(flat, srcs, st)
            else:
                reduced = _ops.push_pull_grads(flat, srcs, PREFIX, comp, sad, op, dd, ds,
                                               process_set=self._bps_process_set)
        return reduced

    def _algorithm_step(self, grads: list, sources: list) -> list:
        all_names = [n[len(PREFIX):] for n in _ops.unique_names(PREFIX, sources)]
        pairs = [(n, s) for n, s in zip(all_names, sources) if _is_variable(s)]
        key = tuple(n for n, _ in pairs)
        run = _RUNS.get(key)
        if run is None:
            run = _RUNS[key] = _TapeRun(self._bps_alg, list(key), [s for _, s in pairs])
        reduce = _algorithms.wants(run.algorithm, "reduce_gradients")
        dense = [i for i, g in enumerate(grads) if g is not None and not
                 isinstance(g, tf.IndexedSlices)]
        if tf.executing_eagerly():
            run.step()
            if reduce:
                out = run.reduce([all_names[i] for i in dense],
                                 [grads[i].numpy() for i in dense])
                grads = list(grads)
                for i, g in zip(dense, out):
                    grads[i] = tf.convert_to_tensor(g)
            return grads
        deps = [g.values if isinstance(g, tf.IndexedSlices) else g
                for g in grads if g is not None]
        with tf.control_dependencies(deps):   # after backprop read the variables
            op = tf.py_function(lambda: np.int32(run.step()), [], tf.int32)
        grads = _after(grads, op)
        if reduce and dense:
            outs = tf.numpy_function(
                lambda *a: run.reduce([all_names[i] for i in dense], list(a)),
                [grads[i] for i in dense], [grads[i].dtype for i in dense], stateful=True)
            grads = list(grads)
            for i, o in zip(dense, outs if isinstance(outs, (list, tuple)) else [outs]):
                o.set_shape(grads[i].shape)
                grads[i] = o
        return grads

    def finish(self) -> None:
        """:func:`finish`: the final exchange of every tape's algorithm (every rank)."""
        finish()


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "",
                            compression=Compression.none, sparse_as_dense: bool = False,
                            op=_ops.Average, gradient_predivide_factor: float = 1.0,
                            num_groups: int = 0, groups=None, process_set=None,
                            scale_local_gradients=True, compression_params: dict | None = None,
                            algorithm=None, optimizer=None):
    """Wrap a recorded ``tf.GradientTape``: its gradients are averaged over workers.

    Each gradient's push_pull starts as soon as backpropagation produces it (first
    layers get the highest priority); ``gradient()`` waits once for all.
    ``tf.IndexedSlices`` gradients stay sparse unless ``sparse_as_dense=True``.
    ``compression_params`` (the original BytePS keys, docs/compression.md) compresses
    dense gradients in the core.  ``algorithm`` (a ``bps.algorithms`` instance; AsyncPS
    by default with ``BYTEPS_ENABLE_ASYNC=1``): ``gradient()`` returns local gradients
    and the algorithm runs on the variables among the sources (call ``bps.finish()``
    on every rank at the end; module docstring).  ``optimizer``: the Keras optimizer
    that applies the gradients (its learning rate drives lr-aware error feedback; a
    ``bps.QAdamOptimizer`` gets its momentum exchange).  ``register_local_source(v)`` on
    the result keeps ``v``'s gradient local (Horovod's model parallelism), divided by the
    number of workers unless ``scale_local_gradients=False``.  ``process_set`` (Horovod's):
    gradients are averaged among that set's ranks only; a rank outside it keeps its own.
    Horovod's ``gradient_predivide_factor``, ``num_groups`` and ``groups`` are checked and
    accepted (the same average; byteps fuses small tensors itself:
    :func:`byteps.core.api.basics.check_gradient_grouping`).
    """
    adasum, op = is_adasum(op), _ops.resolve_op(op, None)
    from byteps.core.api.basics import check_gradient_grouping
    check_gradient_grouping("DistributedGradientTape", gradient_predivide_factor, num_groups,
                            groups, op == _ops.Average)
    compression = with_params(compression, compression_params)
    if adasum and algorithm is not None:     # the core's rule: op=Adasum is that algorithm
        algorithm = _algorithms.resolve(algorithm, "DistributedGradientTape", _ops.Adasum)
    alg = None if adasum and algorithm is None else _algorithm(algorithm, compression)
    from byteps.core import compat
    if isinstance(alg, _algorithms.Adasum):
        compat.refuse("adasum-tape", "DistributedGradientTape")
    if adasum:
        if getattr(compression, "core_params", None):
            compat.refuse("adasum-compression", "DistributedGradientTape(op=Adasum)")
        op = _ops.Adasum
    ps = _ops.gradient_process_set(process_set)
    if alg is not None and ps is not None:
        compat.refuse("process-set-algorithm", f"DistributedGradientTape(process_set={ps!r}, "
                                               f"algorithm={alg.describe()})")
    if alg is not None and hasattr(optimizer, "_bps_exchange"):
        compat.refuse("qadam-algorithm", f"DistributedGradientTape with "
                                         f"{alg.describe()} and {type(optimizer).__name__}")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    return cls(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op, alg,
               optimizer, gradtape._persistent, gradtape._watch_accessed_variables,
               scale_local_gradients, ps)


def PartialDistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "",
                                   compression=Compression.none, sparse_as_dense: bool = False,
                                   op=_ops.Average, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups=None, process_set=None,
                                   local_layers=None, scale_local_gradients: bool = True):
    """Horovod's: a :func:`DistributedGradientTape` whose ``local_layers`` (Keras layers)
    keep their gradients local (``register_local_source`` for each of their trainable
    weights); the other arguments are :func:`DistributedGradientTape`'s."""
    layers = [] if local_layers is None else local_layers
    if not isinstance(layers, (list, tuple)):
        layers = [layers]
    if not all(hasattr(layer, "trainable_weights") for layer in layers):
        raise ValueError("PartialDistributedGradientTape: local_layers must be Keras layers")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape

"""DistributedOptimizer: an MXNet optimizer whose gradients are averaged across workers.

``DistributedOptimizer(opt)`` returns an instance of a class derived from both
DistributedOptimizer and ``type(opt)`` that carries ``opt``'s state, so
``isinstance(x, mx.optimizer.SGD)``, the learning-rate setters, ``rescale_grad``
set by ``gluon.Trainer`` and pickling in ``Trainer.save_states`` all behave as
for the wrapped optimizer.  Use it with ``gluon.Trainer(..., kvstore=None)`` or
Module's ``init_optimizer(kvstore=None, optimizer=...)``.

With ``BYTEPS_ENABLE_ASYNC=1`` the core's :class:`byteps.core.algorithms.AsyncPS` (the
rule of every plugin) trains asynchronously instead: ``update`` applies the local step to
the parameter, then pushes its change since the last pull and pulls the servers' value
(the first update of a parameter seeds the servers with rank 0's value); no gradient is
averaged.  Call :meth:`DistributedOptimizer.finish` on every rank at the end so that all
ranks hold the servers' final parameters.
"""
from __future__ import annotations

import itertools

import numpy as np

from byteps.core import algorithms as _algorithms
from byteps.core import api as core
from byteps.mxnet._mx import mx
from byteps.mxnet.ops import (
    check_dense,
    drain,
    group_prefix,
    host_array,
    gradient_set,
    plain_name,
    postscale,
    predivide,
    set_allreduce,
    wait_all,
    writer,
)

_SUBCLASSES: dict[type, type] = {}
_SERIAL = itertools.count()


def _subclass(inner: type) -> type:
    sub = _SUBCLASSES.get(inner)
    if sub is None:
        sub = type(f"Distributed{inner.__name__}", (DistributedOptimizer, inner),
                   {"__module__": __name__, "_bps_inner_cls": inner})
        _SUBCLASSES[inner] = sub
    return sub


def _rewrap(inner: type, state: dict, kwargs: dict | None = None) -> DistributedOptimizer:
    plain = inner.__new__(inner)
    plain.__setstate__(state)
    return DistributedOptimizer(plain, **(kwargs or {}))


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wrap an MXNet optimizer so that ``update`` first averages the gradient across
    all workers (``push_pull``, priority ``-index``), then applies the update."""

    _bps_inner_cls: type = mx.optimizer.Optimizer

    def __new__(cls, optimizer, *args, **kwargs):
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mxnet Optimizer (e.g. "
                            f"mx.optimizer.create('sgd', ...)), got {type(optimizer).__name__}")
        inner = type(optimizer)._bps_inner_cls if isinstance(
            optimizer, DistributedOptimizer) else type(optimizer)
        return object.__new__(_subclass(inner))

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=None):  # pylint: disable=super-init-not-called
        self.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                              if not k.startswith("_bps_")})
        # Horovod's arguments: gradients divided by the factor before the sum and multiplied
        # after; num_groups is a fusion hint (each gradient is pushed on its own anyway);
        # a rank outside process_set trains on its own gradients
        self._bps_kwargs = {"gradient_predivide_factor": gradient_predivide_factor,
                            "num_groups": num_groups, "process_set": process_set}  # pickling
        self._bps_factor = predivide(gradient_predivide_factor, "DistributedOptimizer",
                                     num_groups)
        self._bps_groups = int(num_groups)
        self._bps_set, self._bps_outside = gradient_set(process_set)
        self._bps_busy = False
        self._bps_ctx: dict = {}
        self._bps_names: dict = {}
        self._bps_serial = next(_SERIAL)
        self._bps_alg = None          # AsyncPS under BYTEPS_ENABLE_ASYNC=1 (first update)
        self._bps_seeded: dict = {}   # index -> (weight, master copy) AsyncPS knows

    # --------------------------------------------------------------- wrapping
    def __reduce__(self):
        state = {k: v for k, v in self.__getstate__().items() if not k.startswith("_bps_")}
        return (_rewrap, (self._bps_inner_cls, state, self._bps_kwargs))

    def _bps_unwrap(self):
        """A plain optimizer of the wrapped class with this one's current state."""
        inner = self._bps_inner_cls
        plain = inner.__new__(inner)
        plain.__dict__.update({k: v for k, v in self.__dict__.items()
                               if not k.startswith("_bps_")})
        return plain

    # ----------------------------------------------------------------- update
    def update(self, index, weight, grad, state):
        """Average ``grad`` across workers, then update ``weight`` (asynchronous mode:
        update ``weight``, then exchange it through AsyncPS)."""
        self._bps_update(super().update, index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """Average ``grad`` across workers, then update ``weight`` (mixed precision)."""
        self._bps_update(super().update_multi_precision, index, weight, grad, state)

    def _bps_update(self, step, index, weight, grad, state) -> None:
        if self._bps_busy:           # the inner class's update calls the other one
            return step(index, weight, grad, state)
        alg = self._bps_algorithm()
        if alg is not None:
            self._bps_seed(alg, index, weight, state)
        else:
            self._bps_reduce(index, weight, grad)
        self._bps_busy = True
        try:
            step(index, weight, grad, state)
        finally:
            self._bps_busy = False
        if alg is not None:
            self._bps_exchange(alg.after_step, index)

    # ------------------------------------------------------ asynchronous (AsyncPS)
    def _bps_algorithm(self):
        """The core's AsyncPS when BYTEPS_ENABLE_ASYNC=1 and there are other workers."""
        if self._bps_alg is None and core.size() > 1 and core.get_config().enable_async:
            if self._bps_set is not None:
                from byteps.core import compat
                compat.refuse("process-set-algorithm", f"DistributedOptimizer(process_set="
                                                       f"{self._bps_set!r}) under "
                                                       f"BYTEPS_ENABLE_ASYNC=1 (AsyncPS)")
            self._bps_alg = _algorithms.default()
            self._bps_alg.bind(None, 1, subject="byteps.mxnet.DistributedOptimizer")
        return self._bps_alg

    def _bps_targets(self, index, weight, state) -> list:
        """(index, weight, the float32 master copy mixed precision updates, or None)."""
        if isinstance(index, (list, tuple)):
            return [t for i, w, s in zip(index, weight, state)
                    for t in self._bps_targets(i, w, s)]
        master = None
        if getattr(self, "multi_precision", False) and weight.dtype == np.float16 \
                and isinstance(state, (list, tuple)) and state \
                and getattr(state[0], "dtype", None) == np.float32:
            master = state[0]
        return [(index, weight, master)]

    def _bps_seed(self, alg, index, weight, state) -> None:
        """A parameter's first update: the servers start from rank 0's value (every
        rank updates the same parameters in the same order: the seed is collective)."""
        new = [t for t in self._bps_targets(index, weight, state)
               if t[0] not in self._bps_seeded]
        for t in new:
            self._bps_seeded[t[0]] = t[1:]
        if new:
            self._bps_exchange(alg.init, [t[0] for t in new])

    def _bps_exchange(self, hook, index) -> None:
        """Run an AsyncPS hook on the parameters ``index`` and write the result back."""
        indices = list(index) if isinstance(index, (list, tuple)) else [index]
        arrs = {}
        for i in indices:
            weight, master = self._bps_seeded[i]
            src = master if master is not None else weight
            arrs[self._bps_name(i, "parameter")] = np.ascontiguousarray(src.asnumpy())
        hook(arrs)
        for i in indices:
            weight, master = self._bps_seeded[i]
            value = arrs[self._bps_name(i, "parameter")]
            if master is not None:
                master[:] = value
            weight[:] = value.astype(weight.dtype, copy=False)

    def finish(self) -> None:
        """End of asynchronous training (every rank): pull the servers' final parameters
        into every parameter this optimizer updated, so that all ranks end identical.
        Does nothing in synchronous mode."""
        if self._bps_alg is not None and self._bps_seeded:
            self._bps_exchange(self._bps_alg.finish, sorted(self._bps_seeded, key=str))

    def _bps_name(self, index, kind: str = "gradient") -> str:
        name = self._bps_names.get((index, kind))
        if name is None:
            params = getattr(self, "param_dict", None) or {}
            if params:
                keys = sorted(params, key=str)
                prefix = group_prefix(("params", tuple(params[k].name for k in keys)))
            else:
                prefix = group_prefix(("optimizer", self._bps_serial))
            suffix = f"_{plain_name(params[index].name)}" if index in params else ""
            name = self._bps_names[(index, kind)] = f"{prefix}{kind}_{index}{suffix}"
        return name

    def _bps_reduce(self, index, weight, grad) -> None:
        if core.size() == 1:
            return
        if isinstance(index, (list, tuple)):
            items = list(zip(index, weight, grad))
        else:
            items = [(index, weight, grad)]
        if self._bps_outside:       # named all the same: group prefixes follow every rank's
            for i, _, _ in items:   # order of first use (ops.group_prefix)
                self._bps_name(i)
            return
        if self._bps_set is not None:
            names = [self._bps_name(i) for i, _, _ in items]
            set_allreduce([check_dense(g, f"gradient {n!r}") for n, (_, _, g) in
                           zip(names, items)], names, self._bps_set, self._bps_factor)
            return
        pending = []
        try:
            self._bps_submit(items, pending)
        except BaseException:
            drain(pending)
            raise
        wait_all(pending)

    def _bps_submit(self, items: list, pending: list) -> None:
        for idx, w, g in items:
            name = self._bps_name(idx)
            check_dense(g, f"gradient {name!r}")
            ctx = self._bps_ctx.setdefault(idx, w.context)
            if ctx != w.context:
                raise core.BytePSError(
                    f"DistributedOptimizer: parameter index {idx} is updated on {ctx} and on "
                    f"{w.context}; with several devices per process use "
                    f"bps.DistributedTrainer, which sums the devices' gradients first")
            arr, shared = host_array(g)
            prio = -idx if isinstance(idx, int) else 0
            write = writer([g], arr if shared else None)
            if self._bps_factor != 1.0:      # in place: the result overwrites it
                arr /= arr.dtype.type(self._bps_factor)
                write = postscale(write, self._bps_factor)
            pending.append((core.push_pull_async(arr, name, average=True, priority=prio,
                                                 out=arr), write))


"""DistributedOptimizer: an MXNet optimizer whose gradients are averaged across workers.

``DistributedOptimizer(opt)`` returns an instance of a class derived from both
DistributedOptimizer and ``type(opt)`` that carries ``opt``'s state, so
``isinstance(x, mx.optimizer.SGD)``, the learning-rate setters, ``rescale_grad``
set by ``gluon.Trainer`` and pickling in ``Trainer.save_states`` all behave as
for the wrapped optimizer.  Use it with ``gluon.Trainer(..., kvstore=None)`` or
Module's ``init_optimizer(kvstore=None, optimizer=...)``.
"""
from __future__ import annotations

import itertools

from byteps.core import api as core
from byteps.mxnet._mx import mx
from byteps.mxnet.ops import (
    check_dense,
    drain,
    group_prefix,
    host_array,
    plain_name,
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


def _rewrap(inner: type, state: dict) -> DistributedOptimizer:
    plain = inner.__new__(inner)
    plain.__setstate__(state)
    return DistributedOptimizer(plain)


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

    def __init__(self, optimizer):  # pylint: disable=super-init-not-called
        self.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                              if not k.startswith("_bps_")})
        self._bps_busy = False
        self._bps_ctx: dict = {}
        self._bps_names: dict = {}
        self._bps_serial = next(_SERIAL)
        if core.is_initialized() and core.get_config().enable_async:
            raise NotImplementedError(
                "BYTEPS_ENABLE_ASYNC=1 (asynchronous training) is not available yet in "
                "byteps.mxnet; unset it to train synchronously")

    # --------------------------------------------------------------- wrapping
    def __reduce__(self):
        state = {k: v for k, v in self.__getstate__().items() if not k.startswith("_bps_")}
        return (_rewrap, (self._bps_inner_cls, state))

    def _bps_unwrap(self):
        """A plain optimizer of the wrapped class with this one's current state."""
        inner = self._bps_inner_cls
        plain = inner.__new__(inner)
        plain.__dict__.update({k: v for k, v in self.__dict__.items()
                               if not k.startswith("_bps_")})
        return plain

    # ----------------------------------------------------------------- update
    def update(self, index, weight, grad, state):
        """Average ``grad`` across workers, then update ``weight``."""
        if not self._bps_busy:
            self._bps_reduce(index, weight, grad)
        self._bps_busy = True
        try:
            super().update(index, weight, grad, state)
        finally:
            self._bps_busy = False

    def update_multi_precision(self, index, weight, grad, state):
        """Average ``grad`` across workers, then update ``weight`` (mixed precision)."""
        if not self._bps_busy:
            self._bps_reduce(index, weight, grad)
        self._bps_busy = True
        try:
            super().update_multi_precision(index, weight, grad, state)
        finally:
            self._bps_busy = False

    def _bps_name(self, index) -> str:
        name = self._bps_names.get(index)
        if name is None:
            params = getattr(self, "param_dict", None) or {}
            if params:
                keys = sorted(params, key=str)
                prefix = group_prefix(("params", tuple(params[k].name for k in keys)))
            else:
                prefix = group_prefix(("optimizer", self._bps_serial))
            suffix = f"_{plain_name(params[index].name)}" if index in params else ""
            name = self._bps_names[index] = f"{prefix}gradient_{index}{suffix}"
        return name

    def _bps_reduce(self, index, weight, grad) -> None:
        if core.size() == 1:
            return
        if isinstance(index, (list, tuple)):
            items = list(zip(index, weight, grad))
        else:
            items = [(index, weight, grad)]
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
            pending.append((core.push_pull_async(arr, name, average=True, priority=prio,
                                                 out=arr), writer([g], arr if shared else None)))

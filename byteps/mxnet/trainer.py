"""DistributedTrainer: a gluon.Trainer whose gradients are averaged by BytePS."""
from __future__ import annotations

import warnings

import numpy as np

from byteps.core import algorithms as _algorithms
from byteps.core import api as core
from byteps.mxnet._mx import mx
from byteps.mxnet.compression import horovod_compression, parse_compression
from byteps.mxnet.ops import (
    broadcast_arrays,
    broadcast_when_initialised,
    check_dense,
    drain,
    gradient_set,
    group_prefix,
    host_array,
    plain_name,
    postscale,
    predivide,
    set_allreduce,
    wait_all,
    writer,
)
from byteps.mxnet.optimizer import DistributedOptimizer


def _param_list(params) -> list:
    # Insertion order is the block structure, the same on every rank.  (gluon.Trainer
    # sorts by name, and names carry per-process counters that may differ by rank.)
    if isinstance(params, (dict, mx.gluon.ParameterDict)):
        return list(params.values())
    if isinstance(params, (list, tuple)):
        return list(params)
    raise ValueError(f"DistributedTrainer needs a ParameterDict, a dict or a list of "
                     f"Parameters, got {type(params).__name__}")


class DistributedTrainer(mx.gluon.Trainer):
    """``gluon.Trainer`` for BytePS: parameters are broadcast from ``root_rank`` when the
    trainer is made (deferred ones when the first forward pass initialises them) and
    again at the first step; each step averages the gradients across all workers.
    Every rank must create it.

    Each gradient's push_pull starts as soon as MXNet has computed it (last layers
    first); front layers get the higher priority, since the next forward pass needs
    them first.  ``compression_params`` takes the original BytePS keys (e.g.
    ``{"compressor": "onebit", "ef": "vanilla"}``, or ``{"fp16": True}``): gradients are
    compressed in the core on their way to the servers and back (docs/compression.md).

    Horovod's keywords work too: ``compression=bps.Compression.fp16`` (the core's fp16
    compressor), ``gradient_predivide_factor`` (gradients divided by it before the sum,
    multiplied after), ``prefix`` (names this trainer's tensors: two trainers over
    different parameters need different prefixes in Horovod; here they are told apart
    without one too), ``num_groups`` (a fusion hint; every gradient is pushed on its
    own as soon as it is ready) and ``process_set`` (gradients averaged over that set;
    a rank outside it trains on its own gradients).
    """

    def __init__(self, params, optimizer, optimizer_params=None, root_rank=0,
                 compression_params=None, algorithm=None, compression=None,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0, process_set=None):
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._bps_unwrap()
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer. We have unwrapped it for you.", stacklevel=2)
        compression_params = horovod_compression(compression, compression_params)
        self._bps_cparams, optimizer_params = parse_compression(compression_params,
                                                                optimizer_params)
        # Horovod's arguments (see the class docstring)
        self._bps_factor = predivide(gradient_predivide_factor, "DistributedTrainer", num_groups)
        self._bps_groups = int(num_groups)
        self._bps_set, self._bps_outside = gradient_set(process_set)
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"DistributedTrainer: prefix must be a string, got {prefix!r}")
        # a core algorithm other than SyncPS (BYTEPS_ENABLE_ASYNC=1: AsyncPS, every plugin's
        # rule; Decentralized, AsyncModelAverage...; docs/algorithms.md) runs after the step
        alg = _algorithms.resolve(algorithm, "DistributedTrainer")
        if not alg.plugin_gradients and _algorithms.wants(alg, "reduce_gradients"):
            raise core.BytePSError(f"DistributedTrainer: {alg.describe()} combines gradients "
                                   f"(reduce_gradients), which DistributedTrainer does not "
                                   f"call; combine parameters in after_step instead")
        if self._bps_set is not None and not alg.plugin_gradients:
            from byteps.core import compat
            compat.refuse("process-set-algorithm", f"DistributedTrainer(process_set="
                                                   f"{self._bps_set!r}, algorithm="
                                                   f"{alg.describe()})")
        if not alg.plugin_gradients:
            # the core's one rule: the algorithm compresses what it exchanges
            alg.bind(self._bps_cparams, 1, subject=f"DistributedTrainer: {alg.describe()}")
        self._bps_alg = None if alg.plugin_gradients else alg
        self._bps_final = alg           # finish(): every algorithm's final exchange
        self._bps_alg_ready = False
        super().__init__(_param_list(params), optimizer, optimizer_params=optimizer_params,
                         kvstore=None)
        from byteps.core.collective.ops import check_root
        self.root_rank = check_root(root_rank, "DistributedTrainer")
        self._bps_size = size = core.size()
        self._bps_index = {id(p): i for i, p in enumerate(self._params)}
        prefix = f"{prefix}." if prefix else \
            group_prefix(("params", tuple(p.name for p in self._params)))
        plain = [plain_name(p.name) for p in self._params]
        self._bps_grad_names = [f"{prefix}gradient_{i}_{n}" for i, n in enumerate(plain)]
        self._bps_param_names = [f"{prefix}parameter_{i}_{n}" for i, n in enumerate(plain)]
        for i, param in enumerate(self._params):
            core.declare(self._bps_param_names[i])
            if param.grad_req != "null":
                core.declare(self._bps_grad_names[i], compression_params=self._bps_cparams)
        # Broadcast now, before the first forward pass (gradients of the first step
        # must come from identical parameters); a parameter whose initialisation is
        # deferred is broadcast the moment the forward pass initialises it.  The first
        # step broadcasts all of them once more, like the original (a script may load a
        # checkpoint on the root rank after making the trainer).
        for param in self._params:
            if param._deferred_init and not self._bps_outside:
                broadcast_when_initialised(
                    param, self._bps_param_names[self._bps_index[id(param)]], self.root_rank,
                    self._bps_set)
        self._bps_broadcast([p for p in self._params if not p._deferred_init])

    def step(self, batch_size, ignore_stale_grad=False):
        """Average the gradients across workers, then update the parameters;
        gradients are normalised by ``1/batch_size`` (this worker's batch)."""
        before = self._bps_alg is not None and _algorithms.wants(self._bps_alg, "before_step")
        if before:         # Adasum: the values this step starts from (first step: broadcast)
            self._init_params()
            self._bps_alg.before_step(self._bps_arrays()[2])
        super().step(batch_size, ignore_stale_grad)
        if self._bps_alg is not None:
            self._bps_async_exchange(before)
        core.step_done(in_set=self._bps_set is not None or self._bps_outside)   # timeline

    def _bps_arrays(self) -> tuple[list, list, dict]:
        """(parameters, their names, {name: numpy copy of the first context's data})."""
        params = [p for p in self._params if p.grad_req != "null" and not p._deferred_init]
        names = [self._bps_param_names[self._bps_index[id(p)]] for p in params]
        return params, names, {n: np.ascontiguousarray(p.list_data()[0].asnumpy())
                               for n, p in zip(names, params)}

    def _bps_async_exchange(self, before: bool = False) -> None:
        """A core algorithm after the local update (AsyncPS: push the parameter change,
        pull the servers' parameters, seeded with root_rank's values at the first step;
        ``before``: the step began with ``before_step``, so its first step exchanges too)."""
        params, names, arrs = self._bps_arrays()
        if not self._bps_alg_ready:
            self._bps_alg_ready = True
            self._bps_alg.init(arrs)
            if before:
                self._bps_alg.after_step(arrs)
        else:
            self._bps_alg.after_step(arrs)
        for n, p in zip(names, params):
            for d in p.list_data():
                d[:] = mx.nd.array(arrs[n], ctx=d.context, dtype=d.dtype)

    def finish(self) -> None:
        """End of training: the algorithm's final exchange (every rank), so all ranks end
        with identical parameters (SyncPS after an uneven ``join()``: the model of the rank
        that joined last)."""
        if self._bps_alg is not None and not self._bps_alg_ready:
            return
        params, names, arrs = self._bps_arrays()
        self._bps_final.finish(arrs)
        for n, p in zip(names, params):
            for d in p.list_data():
                d[:] = mx.nd.array(arrs[n], ctx=d.context, dtype=d.dtype)

    def _init_params(self):
        # At the first step: broadcast every initialised parameter from root_rank;
        # those whose deferred initialisation has not happened yet wait.
        ready = [p for p in self._params_to_init if not p._deferred_init]
        self._params_to_init = [p for p in self._params_to_init if p._deferred_init]
        self._bps_broadcast(ready)

    def _bps_broadcast(self, params: list) -> None:
        """From ``root_rank``; a trainer of a process set among the set's ranks (a rank
        outside it trains alone: nothing)."""
        if params and not self._bps_outside:
            broadcast_arrays([(self._bps_param_names[self._bps_index[id(p)]], p.list_data())
                              for p in params], self.root_rank, self._bps_set)

    def _allreduce_grads(self):
        if self._bps_alg is not None or (self._bps_size == 1 and len(self._contexts) == 1):
            return
        if self._bps_set is not None or self._bps_outside:
            return self._bps_set_allreduce()
        pending = []
        if self._bps_cparams:
            core.set_compression_lr(float(self.learning_rate))   # lr-aware error feedback
        try:
            # Last layers' gradients are computed first by backward: start them first,
            # each as soon as MXNet's engine has it (host_array waits for that one only).
            for i in reversed(range(len(self._params))):
                param = self._params[i]
                if param.grad_req == "null":
                    continue
                grads = param.list_grad()
                name = self._bps_grad_names[i]
                view, shared = host_array(check_dense(grads[0], f"gradient {name!r}"))
                for g in grads[1:]:
                    np.add(view, g.asnumpy(), out=view)
                write = writer(grads, view if shared else None)
                if self._bps_factor != 1.0:       # in place: the result overwrites it
                    view /= view.dtype.type(self._bps_factor)
                    write = postscale(write, self._bps_factor)
                handle = core.push_pull_async(view, name, average=True, priority=-i, out=view)
                pending.append((handle, write))
        except BaseException:
            drain(pending)
            raise
        wait_all(pending)

    def _bps_set_allreduce(self) -> None:
        """Average the gradients over the trainer's process set (a rank outside it trains
        on its own gradients, as in Horovod)."""
        params = [(i, p) for i, p in enumerate(self._params) if p.grad_req != "null"]
        grads = []
        for _, p in params:
            gs = p.list_grad()
            for g in gs[1:]:
                gs[0] += g.as_in_context(gs[0].context)
            grads.append(gs)
        if not self._bps_outside:
            set_allreduce([gs[0] for gs in grads], [self._bps_grad_names[i] for i, _ in params],
                          self._bps_set, self._bps_factor)
        for gs in grads:
            for g in gs[1:]:
                g[:] = gs[0].as_in_context(g.context)

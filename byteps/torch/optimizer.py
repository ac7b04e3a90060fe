"""DistributedOptimizer: wraps any torch.optim optimizer (Horovod/BytePS style).

A hook on every parameter starts that gradient's push_pull as soon as
autograd has accumulated it, so communication overlaps the rest of the
backward pass.  Parameters earlier in the optimizer's order get higher
priority (the next forward pass needs them first).  ``step()`` waits only for
what is still in flight.
"""
from __future__ import annotations

import collections
import contextlib
import warnings
import weakref

import torch

from byteps.core import algorithms as _algorithms
from byteps.core import api as _core
from byteps.torch.compression import Compression
from byteps.torch.ops import declare, push_pull_async_inplace, synchronize

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """Mixin placed in front of the user's optimizer class (see DistributedOptimizer)."""

    def _bps_setup(self, named_parameters, compression, backward_passes_per_step: int,
                   compression_params=None, algorithm=None):
        self._bps_compression = compression
        self._bps_cparams = compression_params
        self._bps_lr = None
        params = _params_of(self)
        # names given for parameters not in the optimizer yet serve add_param_group()
        self._bps_given = _check_named(params, named_parameters) \
            if named_parameters is not None else {}
        self._bps_names, self._bps_priority, self._bps_delay = {}, {}, {}
        self._parameter_names = self._bps_names      # Horovod's name for it
        self._bps_bpps = backward_passes_per_step
        self._bps_handles: dict = {}
        self._bps_resparse: list = []      # sparse gradients exchanged as dense (sparse_as_dense)
        self._bps_requires_update = []
        self._bps_should_sync = True
        self._bps_synchronized = False
        self._bps_hooks = []
        self.algorithm = algorithm          # bound by DistributedOptimizer (the core's rule)
        # every algorithm but SyncPS runs in step() (``_bps_alg_*``); the flag keeps its name
        self._bps_async = not algorithm.plugin_gradients
        self._bps_adopt(params)
        if self._bps_async:
            self._bps_alg_init()

    def _bps_adopt(self, params: list) -> None:
        """Name, declare and hook ``params`` (all of them at setup; a group's later)."""
        from byteps.core.collective.rules import position_name
        at = {id(q): i for i, q in enumerate(_params_of(self))}
        names = {p: self._bps_given.get(id(p)) or position_name(at[id(p)]) for p in params}
        taken = set(self._bps_names.values()) & set(names.values())
        if taken or len(set(names.values())) < len(names):
            raise ValueError(f"parameter names {sorted(taken)[:5]} are used twice; name "
                             f"every parameter once (named_parameters)")
        for p in params:
            self._bps_names[p], self._bps_priority[p] = names[p], -at[id(p)]
            self._bps_delay[p] = self._bps_bpps
        for name in sorted(names.values()):
            declare("Gradient." + name, compression_params=self._bps_cparams)
        self._bps_hook_params([p for p in params if p.requires_grad])

    def _bps_hook_params(self, params: list) -> None:
        """Exchange the gradients of ``params`` from now on: at setup, in a group added,
        and once unfrozen (``requires_grad`` set again: ``_bps_push_missing``)."""
        if self._bps_outside:                # outside the process set: alone
            return
        self._bps_requires_update += params
        if not self._bps_async:
            self._bps_hooks += [_register_hook(p, self._bps_make_hook(p)) for p in params]

    def add_param_group(self, param_group: dict) -> None:
        """The wrapped optimizer's; the group's gradients are exchanged as the others' (every
        rank adds the same groups in the same order), from rank 0's values (a broadcast)."""
        if "_bps_names" not in self.__dict__:        # the wrapped class's own __init__
            return super().add_param_group(param_group)
        if self._bps_async:
            from byteps.core import compat
            compat.refuse("algorithm-param-group", f"add_param_group() on rank "
                          f"{_core.rank()} with {self.algorithm.describe()}")
        super().add_param_group(param_group)
        new = [p for p in self.param_groups[-1]["params"] if p not in self._bps_names]
        if not new:
            return
        self._bps_adopt(new)
        ps = self._bps_process_set
        if ps is None and self._bps_outside:     # a rank outside the process set: alone
            return
        from byteps.torch.functions import broadcast_parameters
        with torch.no_grad():
            broadcast_parameters([(self._bps_names[p], p) for p in new], prefix="ParamGroup.",
                                 root_rank=0 if ps is None else ps._members()[0],
                                 process_set=ps)

    # ------------------------------------------------------------------ algorithms
    def _bps_alg_init(self) -> None:
        """A core algorithm (AsyncPS with BYTEPS_ENABLE_ASYNC=1, AsyncModelAverage, ...)
        on numpy views of the parameters (docs/algorithms.md)."""
        with torch.no_grad():
            named = {n: p for p, n in self._bps_names.items()}    # frozen ones too
            arrs = _as_arrays(named)
            self.algorithm.init(arrs)
            _write_back(named, arrs)

    def _bps_alg_step(self, closure):
        """Gradients (algorithm), parameters before, local step, parameters (algorithm)."""
        with torch.no_grad():
            grads = {n: p.grad for p, n in self._bps_names.items() if p.grad is not None}
            if grads and _algorithms.wants(self.algorithm, "reduce_gradients"):
                arrs = _as_arrays(grads)
                self.algorithm.reduce_gradients(arrs)
                _write_back(grads, arrs)
            if _algorithms.wants(self.algorithm, "before_step"):    # Adasum: where it starts
                self.algorithm.before_step(_as_arrays({n: p for p, n in self._bps_names.items()}))
        loss = super().step(closure)
        with torch.no_grad():
            named = {n: p for p, n in self._bps_names.items()}
            arrs = _as_arrays(named)
            self.algorithm.after_step(arrs)
            _write_back(named, arrs)
        _core.step_done()
        return loss

    def finish(self) -> None:
        """End of training: the algorithm's final exchange (e.g. the last synchronous
        average of AsyncModelAverage; SyncPS after an uneven ``join()``: the model of the
        rank that joined last); every rank must call it."""
        with torch.no_grad():
            named = {n: p for p, n in self._bps_names.items()}
            arrs = _as_arrays(named)
            self.algorithm.finish(arrs)
            _write_back(named, arrs)

    # ------------------------------------------------------------------ hooks
    def _bps_make_hook(self, p):
        # the hook lives on the parameter, outside the garbage collector's view: holding
        # the optimizer and the parameter weakly lets dropped ones be collected
        ref, pref = weakref.ref(self), weakref.ref(p)

        def hook(*_):
            self, p = ref(), pref()
            if self is None or p is None or p.grad is None:
                return
            if self._bps_delay[p] <= 0:
                raise AssertionError(
                    f"Gradients of {self._bps_names[p]!r} were computed more than "
                    f"backward_passes_per_step={self._bps_bpps} times before a call to step(). "
                    f"Increase backward_passes_per_step to accumulate gradients locally.")
            self._bps_delay[p] -= 1
            if self._bps_delay[p] == 0:
                self._bps_handles[p] = self._bps_push(p)
            else:
                self._bps_handles[p] = None
        return hook

    def _bps_push(self, p):
        if p.grad.is_sparse and self._bps_sparse_as_dense:
            p.grad = p.grad.to_dense()
            self._bps_resparse.append(p)    # sparse again after the exchange (Horovod)
        ps = getattr(self, "_bps_process_set", None)
        if p.grad.is_sparse or ps is not None:    # Horovod's sparse allreduce; process sets
            from byteps.torch import compat
            avg = compat.Average if self._bps_average else compat.Sum
            if p.grad.is_sparse:
                return compat.sparse_allreduce_async(p.grad, "Gradient." + self._bps_names[p],
                                                     avg, ps), _SPARSE
            return compat.allreduce_async_(p.grad, name="Gradient." + self._bps_names[p],
                                           op=avg, process_set=ps), _OWN_TENSOR
        if self._bps_cparams and self.param_groups[0]["lr"] != self._bps_lr:
            self._bps_lr = self.param_groups[0]["lr"]   # lr-aware error feedback
            _core.set_compression_lr(float(self._bps_lr))
        comm = self._bps_comm(p) if hasattr(self, "_bps_comm") else None
        if comm is not None:            # the optimizer exchanges another tensor (QAdam)
            tensor, prefix, cparams = comm
            handle = push_pull_async_inplace(tensor, average=self._bps_average,
                                             name=prefix + self._bps_names[p],
                                             priority=self._bps_priority[p],
                                             compression_params=cparams)
            return handle, _OWN_TENSOR
        compressed, ctx = self._bps_compression.compress(p.grad)
        handle = push_pull_async_inplace(compressed, average=self._bps_average,
                                         name="Gradient." + self._bps_names[p],
                                         priority=self._bps_priority[p])
        return handle, ctx

    # ------------------------------------------------------------------ public API
    def synchronize(self) -> None:
        """Wait for every gradient's push_pull (starting those not started yet)."""
        if self._bps_async:
            return
        with torch.no_grad():
            self._bps_push_missing()
            try:
                for p, (handle, ctx) in self._bps_handles.items():
                    out = synchronize(handle)
                    if ctx is _SPARSE:
                        p.grad = out
                        self._bps_delay[p] = self._bps_bpps
                        continue
                    if ctx is _OWN_TENSOR:      # averaged in place; the gradient stays
                        self._bps_delay[p] = self._bps_bpps
                        continue
                    result = self._bps_compression.decompress(out, ctx)
                    if result is not p.grad:
                        p.grad.copy_(result)
                    self._bps_delay[p] = self._bps_bpps
            finally:
                self._bps_handles.clear()
                for p in self._bps_resparse:
                    if p.grad is not None and not p.grad.is_sparse:
                        p.grad = p.grad.to_sparse()
                self._bps_resparse.clear()
        self._bps_synchronized = True

    def _bps_push_missing(self) -> None:
        """Push what autograd did not: parameters without a gradient this step (as zeros)
        and those still accumulating (``backward_passes_per_step``).  A parameter
        unfrozen since (``requires_grad`` set again) takes part from now on, one frozen
        again does not (torch leaves it alone: no gradient, no update)."""
        if len(self._bps_requires_update) < len(self._bps_names) and not self._bps_outside:
            on = set(map(id, self._bps_requires_update))
            self._bps_hook_params([p for p in self._bps_names
                                   if p.requires_grad and id(p) not in on])
        for p in self._bps_requires_update:
            if p not in self._bps_handles and p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                self._bps_handles[p] = None
        for p, value in list(self._bps_handles.items()):
            if value is None:
                self._bps_handles[p] = self._bps_push(p)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize (call synchronize() yourself)."""
        if self._bps_async:
            raise AssertionError(f"skip_synchronize cannot be used with "
                                 f"{self.algorithm.describe()} (asynchronous or "
                                 f"BYTEPS_ENABLE_ASYNC=1 training)")
        self._bps_should_sync = False
        try:
            yield
        finally:
            self._bps_should_sync = True

    def step(self, closure=None):
        """Finish the gradients' push_pulls, then take the wrapped optimizer's step."""
        if self._bps_async:
            return self._bps_alg_step(closure)
        if self._bps_should_sync:
            if self._bps_synchronized and not self._bps_handles:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(); gradients are not "
                              "reduced twice", stacklevel=2)
            else:
                self.synchronize()
        self._bps_synchronized = False
        _core.step_done(in_set=getattr(self, "_bps_in_set", False))   # timeline steps
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True):
        """Like the wrapped optimizer's, but refuses to run while gradients are in flight."""
        if self._bps_handles:
            names = sorted(self._bps_names[p] for p in self._bps_handles)
            raise AssertionError(
                f"optimizer.zero_grad() was called after loss.backward() but before "
                f"optimizer.step() or optimizer.synchronize(): a race ({', '.join(names[:3])}"
                f"{', ...' if len(names) > 3 else ''} still being push_pulled). If another "
                f"optimizer's loss reached these parameters (a GAN's generator step through "
                f"the discriminator), freeze them for it (requires_grad_(False)).")
        return super().zero_grad(set_to_none=set_to_none)


_OWN_TENSOR = object()     # marks a push_pull of an optimizer's own tensor (QAdam)
_SPARSE = object()         # marks a sparse gradient's allreduce (the result replaces .grad)
_VIEWABLE = (torch.float32, torch.float64, torch.float16)


def _as_arrays(named: dict) -> dict:
    """numpy arrays of tensors: views of contiguous CPU tensors, copies otherwise
    (:func:`_write_back` copies those back)."""
    out = {}
    for n, t in named.items():
        t = t.detach()
        if _viewable(t):
            out[n] = t.numpy()
        else:
            dt = t.dtype if t.dtype in _VIEWABLE else torch.float32
            out[n] = t.to("cpu", dt).contiguous().numpy().copy()
    return out


def _viewable(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and t.dtype in _VIEWABLE


def _write_back(named: dict, arrs: dict) -> None:
    for n, t in named.items():
        if not _viewable(t):
            t.copy_(torch.from_numpy(arrs[n]).reshape(t.shape))


def _register_hook(p: torch.Tensor, hook):
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(hook)
    acc = p.expand_as(p).grad_fn.next_functions[0][0]      # torch < 2.1
    return (acc, acc.register_hook(hook))


_CLASSES: dict[type, type] = {}


def _params_of(optimizer) -> list:
    """The optimizer's parameters in order, each once."""
    return list({id(p): p for g in optimizer.param_groups for p in g["params"]}.values())


def _check_named(params: list, named: list) -> dict:
    """Horovod's rules for ``named_parameters`` (checked before anything else, so they hold
    before init() too): (name, tensor) pairs, unique names, every parameter named.
    Returns id(parameter) -> name."""
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) "
                         "tuples, usually model.named_parameters()")
    if any(not isinstance(v, torch.Tensor) for _, v in named):
        raise ValueError("named_parameters should be a sequence of (name, "
                         "torch.Tensor) tuples")
    counts = collections.Counter(k for k, _ in named)
    dups = sorted(k for k, c in counts.items() if c > 1)
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found "
                         f"duplicates: {', '.join(dups)}")
    by_id = {id(v): k for k, v in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but {len(unnamed)} of the "
                         f"optimizer's {len(params)} parameters were not named "
                         f"(positions {unnamed[:10]} in the optimizer's parameter "
                         f"order); pass all of model.named_parameters() or none")
    return by_id


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, staleness: int = 0, op=None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False, process_set=None,
                         compression_params: dict | None = None, algorithm=None):
    """Wrap ``optimizer`` so that gradients are averaged over all workers.

    Returns an instance of a subclass of ``type(optimizer)`` sharing its parameter groups
    and state, so ``isinstance`` and the optimizer's own methods keep working.
    ``named_parameters`` (e.g. ``model.named_parameters()``) names the gradients
    ``"Gradient." + name``; without it they are named by position.
    ``backward_passes_per_step=N`` accumulates N backward passes locally before
    communicating.  ``staleness`` is accepted for compatibility and must be 0.
    ``op=hvd.Adasum`` runs ``bps.algorithms.Adasum()`` (docs/algorithms.md).

    Horovod's arguments are accepted too: ``op`` (``hvd.Average``, the
    default, or ``hvd.Sum``); ``gradient_predivide_factor`` (any positive
    value; the result is the same average, so it only changes rounding in
    Horovod and is ignored here); ``num_groups``/``groups`` (ignored: small
    tensors are fused automatically); ``sparse_as_dense`` (sparse gradients
    are densified; without it they are gathered, as Horovod's
    ``sparse_allreduce_async``); ``process_set`` (gradients averaged among
    that set's ranks, byteps.core.collective.process_sets; compressed there too with
    ``compression_params``, byteps/core/collective/set_ops.py).

    With ``BYTEPS_ENABLE_ASYNC=1`` (asynchronous training, as in the original)
    the servers hold the parameters: they are seeded with rank 0's values when
    the optimizer is built, and every ``step()`` runs the local update, pushes
    the parameter change and pulls the servers' current parameters (the core's
    ``AsyncPS``, as every plugin; ``BYTEPS_ASYNC_STALENESS`` bounds the staleness).

    ``algorithm`` (``bps.algorithms.SyncPS()``, the default; ``AsyncPS()``;
    ``AsyncModelAverage(sync_interval_ms=500)``, or your own subclass of
    ``bps.algorithms.Algorithm``, docs/algorithms.md) chooses the training algorithm;
    call ``optimizer.finish()`` at the end of training for its final exchange.  Every
    algorithm receives ``compression_params`` (``Algorithm.bind``: SyncPS compresses
    gradients, the others the parameter differences they exchange) and
    ``backward_passes_per_step=N`` (autograd accumulates N passes; the algorithm runs
    on ``step()``).

    ``compression_params`` (the original BytePS keys, e.g. ``{"compressor":
    "onebit", "ef": "vanilla"}``) compresses gradients in the core, on the way
    to the servers and back (docs/compression.md); ``compression=
    bps.Compression.fp16`` is the same as ``{"compressor": "fp16"}``.  With
    ``"momentum": "nesterov"`` the momentum moves into the compressor: ``mu`` is
    taken from the optimizer's ``momentum`` (unless given) and the optimizer
    then runs without momentum, as the original documents.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer expects a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise TypeError("this optimizer is already a DistributedOptimizer; wrap the plain "
                         "optimizer once")
    if named_parameters is not None:
        named_parameters = list(named_parameters)
        _check_named(_params_of(optimizer), named_parameters)
    if type(backward_passes_per_step) is not int or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    from byteps.torch.compat import resolve_average
    average = resolve_average(None, op, "DistributedOptimizer")    # op=Adasum: an algorithm
    from byteps.core.api.basics import check_gradient_grouping
    check_gradient_grouping("DistributedOptimizer", gradient_predivide_factor, num_groups,
                            groups, average)
    if staleness != 0:
        raise ValueError(f"staleness={staleness!r} is not supported; use 0 (synchronous "
                         f"training)")
    if not hasattr(compression, "compress") or not hasattr(compression, "decompress"):
        raise TypeError(f"compression must be bps.Compression.none, bps.Compression.fp16 or "
                        f"an object with compress()/decompress(); got {compression!r}")
    base = type(optimizer)
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(base.__name__, (_DistributedOptimizer, base),
                                    {"__module__": base.__module__,
                                     "__qualname__": base.__qualname__})
    dist = cls.__new__(cls)
    # Share param_groups, state and hooks; drop per-instance method patches (an LR
    # scheduler made before wrapping patches optimizer.step) so ours are used.
    dist.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                          if k not in ("step", "zero_grad", "synchronize")})
    dist._bps_average, dist._bps_sparse_as_dense = average, bool(sparse_as_dense)
    from byteps.core.collective import ops as _coll
    # a rank outside ``process_set`` trains on its own gradients (Horovod: no hooks there)
    outside = process_set is not None and callable(getattr(process_set, "included", None)) \
        and getattr(process_set, "process_set_id", 0) != 0 and not process_set.included()
    dist._bps_process_set = None if outside else _coll._set(process_set)
    dist._bps_outside, dist._bps_in_set = outside, outside or dist._bps_process_set is not None
    algorithm = _algorithms.resolve(algorithm, op=op)  # Adasum, ENABLE_ASYNC: AsyncPS, bound below
    if dist._bps_process_set is not None and not algorithm.plugin_gradients:
        from byteps.core import compat
        compat.refuse("process-set-algorithm", f"DistributedOptimizer(process_set="
                                               f"{dist._bps_process_set!r}, algorithm="
                                               f"{algorithm.describe()})")
    # the core's one rule (Algorithm.bind): the algorithm receives the compressor and the
    # backward passes.  SyncPS's gradients are compressed in the core pipeline (names
    # declared below); the other algorithms compress what they exchange themselves.
    if algorithm.plugin_gradients:
        compression, compression_params = _core_compression(
            dist, compression, compression_params or algorithm.compression_params)
        algorithm.bind(compression_params, backward_passes_per_step)
        compression_params = algorithm.compression_params
    else:
        compression, params = _fp16_params(compression, compression_params)
        algorithm.bind(params, backward_passes_per_step)
        compression_params = None
    dist._bps_setup(named_parameters, compression, backward_passes_per_step, compression_params,
                    algorithm)
    return dist


def _fp16_params(compression, params):
    """``compression=Compression.fp16`` as ``compression_params={"compressor": "fp16"}``."""
    from byteps.torch.compression import FP16Compressor
    if compression is FP16Compressor or isinstance(compression, FP16Compressor):
        if params and params.get("compressor") not in (None, "fp16"):
            raise ValueError(f"compression=Compression.fp16 and compression_params="
                             f"{params!r} both choose a compressor; pass one of them")
        params, compression = dict(params or {}, compressor="fp16"), Compression.none
    return compression, params


def _core_compression(opt, compression, params):
    """Move fp16 and ``compression_params`` into the core pipeline; take compressor
    momentum's ``mu`` from the optimizer and switch the optimizer's own momentum off."""
    compression, params = _fp16_params(compression, params)
    if not params:
        return compression, None
    from byteps import compression as _comp
    params = dict(params)
    spec = _comp.parse(params)              # a clear error for bad keys and values, now
    if spec is not None and spec.momentum and "mu" not in params:
        mus = {g.get("momentum", 0) for g in opt.param_groups}
        if len(mus) != 1 or not 0 < next(iter(mus)) < 1:
            raise ValueError(f"compression_params['momentum']={spec.momentum!r} takes mu from "
                             f"the optimizer's momentum, but its param groups have momentum "
                             f"{sorted(mus)}; give the optimizer one momentum in (0, 1) or "
                             f"compression_params['mu']")
        params["mu"] = float(next(iter(mus)))
    if spec is not None and spec.momentum:
        for g in opt.param_groups:         # the compressor does the momentum now
            if "momentum" in g:
                g["momentum"] = 0
            if "nesterov" in g:
                g["nesterov"] = False
    return compression, params

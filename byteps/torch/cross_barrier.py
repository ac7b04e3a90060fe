"""CrossBarrier: the original BytePS's barrier crossing for PyTorch (ByteScheduler, SOSP'19).

    import byteps.torch.cross_barrier as bps
    bps.init()
    optimizer = bps.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                 named_parameters=model.named_parameters(), num_steps=1000)

A DistributedOptimizer's ``step()`` waits for every averaged gradient, then updates every
parameter, so the next forward pass starts only when the last gradient has come back.
CrossBarrier crosses that barrier between two steps:

* each gradient's push_pull starts when autograd has it (as DistributedOptimizer does),
  earlier layers with higher priority, so they come back first;
* a background thread updates each parameter as soon as its averaged gradient is back:
  the wrapped optimizer's own ``step`` on that parameter alone, with the hyper-parameters
  (lr, ...) it had when the gradient was pushed, then the gradient is zeroed;
* ``step()`` returns at once, and the next forward pass waits, module by module, only for
  the parameters that module is about to use.

So the next forward pass overlaps the rest of the exchange, and the model trains exactly as
with DistributedOptimizer: tests/test_cross_barrier.py compares the parameters.  The
wrapped optimizer must update each parameter from its own gradient and state alone, as
every ``torch.optim`` optimizer but LBFGS does.  ``synchronize()`` (and ``state_dict()``, the
model's ``state_dict()``, the step numbered ``num_steps``) waits until every update is
applied; gradients are consumed by then, so clip them with DistributedOptimizer instead.
With an algorithm other than SyncPS (``BYTEPS_ENABLE_ASYNC=1``, ``algorithm=``) the
algorithm's own step runs and nothing is crossed (docs/torch.md).

This module also exports everything :mod:`byteps.torch` does: the original example imports
only ``byteps.torch.cross_barrier as bps``.
"""
from __future__ import annotations

import bisect
import itertools
import logging
import queue
import threading
import time
import weakref

import torch

import byteps.torch as _bps
from byteps.core import api as _core
from byteps.torch import *  # noqa: F401,F403  (the original example uses bps.init, ...)
from byteps.torch.compression import Compression
from byteps.torch.ops import synchronize as _synchronize
from byteps.torch.optimizer import _OWN_TENSOR, _SPARSE, DistributedOptimizer

__all__ = list(_bps.__all__) + ["CrossBarrier"]

log = logging.getLogger("byteps.torch.cross_barrier")

_STALL_S = 2.0       # no update for this long: block on the most urgent one (its errors)
_POLL_S = 0.005      # the longest an update waits behind a less urgent one
_REFUSED = (torch.optim.LBFGS,)


def __getattr__(name):          # bps.suspend, bps.resume, bps.parallel, bps.elastic
    return getattr(_bps, name)


def _done(handle, timeout: float) -> bool:
    """Whether ``handle`` finished; True when it cannot be waited for (the job is gone):
    its synchronize then raises the reason, which reaches the training thread."""
    try:
        return _core.wait(handle, timeout)
    except Exception:
        return True


class _Pending:
    """A pushed gradient the background thread has to apply."""
    __slots__ = ("order", "p", "handle", "ctx", "group")

    def __init__(self, order, p, handle, ctx, group):
        self.order, self.p, self.handle, self.ctx, self.group = order, p, handle, ctx, group

    def __lt__(self, other):
        return self.order < other.order


class _CrossBarrier:
    """Placed in front of the DistributedOptimizer's class (see :func:`CrossBarrier`)."""

    def _cb_setup(self, model: torch.nn.Module, base: type, num_steps: int) -> None:
        self._cb_model = model
        self._cb_base, self._cb_final, self._cb_steps = base, num_steps, 0
        self._cb_seq = itertools.count()
        self._cb_ready = {p: threading.Event() for p in self._bps_requires_update}
        for ev in self._cb_ready.values():
            ev.set()
        self._cb_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cb_idle = threading.Condition()
        self._cb_inflight = 0
        self._cb_error: BaseException | None = None
        self._cb_groups_of: tuple = ((), {})     # (ids of the groups, id(p) -> group)
        self._cb_hooks = []
        if self._bps_async:         # an algorithm's own step: nothing to cross
            return
        self._cb_gates(self._bps_requires_update)
        if hasattr(model, "register_state_dict_pre_hook"):
            self._cb_hooks.append(model.register_state_dict_pre_hook(
                lambda *_a, **_k: self.synchronize()))
        if hasattr(model, "register_load_state_dict_pre_hook"):   # no update lands after it
            self._cb_hooks.append(model.register_load_state_dict_pre_hook(
                lambda *_a, **_k: self.synchronize()))
        # the thread holds the optimizer weakly: dropped, it is collected and the thread ends
        self._cb_thread = threading.Thread(target=_cb_run, name="bps-crossbarrier",
                                           args=(weakref.ref(self), self._cb_queue),
                                           daemon=True)
        weakref.finalize(self, self._cb_queue.put, None)
        self._cb_thread.start()
        _core.BEFORE_SHUTDOWN.add(self)

    def _cb_gates(self, params: list) -> None:
        """A forward pre-hook on each module that owns some of ``params``: it waits for
        their updates."""
        ids = {id(p) for p in params}
        for mod in self._cb_model.modules():
            mine = [p for p in mod.parameters(recurse=False) if id(p) in ids]
            if mine:
                self._cb_hooks.append(mod.register_forward_pre_hook(self._cb_gate(mine)))

    def add_param_group(self, param_group: dict) -> None:
        """DistributedOptimizer's; the modules of the new parameters wait for them too."""
        if "_cb_ready" not in self.__dict__:       # the wrapped class's own __init__
            return super().add_param_group(param_group)
        ps = param_group["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        owned = {id(p) for p in self._cb_model.parameters()}
        if any(id(p) not in owned for p in ps):     # as CrossBarrier() checks
            raise ValueError("CrossBarrier.add_param_group: some of the group's parameters "
                             "are not parameters of the model (their forward pass could not "
                             "wait for their update); add the module to the model first")
        self.synchronize()                    # no update in flight while the maps grow
        super().add_param_group(dict(param_group, params=ps))

    def _bps_hook_params(self, params: list) -> None:
        """DistributedOptimizer's (a group added, a parameter unfrozen); their modules wait
        for their updates too."""
        super()._bps_hook_params(params)
        if "_cb_ready" not in self.__dict__:       # at setup: _cb_setup does it
            return
        new = [p for p in params if p not in self._cb_ready]
        for p in new:
            self._cb_ready[p] = threading.Event()
            self._cb_ready[p].set()
        if not self._bps_async:
            self._cb_gates(new)

    # ------------------------------------------------------------------ main thread
    def _cb_gate(self, params: list):
        def pre_forward(_module, _inputs):
            for p in params:
                ready = self._cb_ready[p]
                if not ready.is_set():
                    ready.wait()
            self._cb_raise()
        return pre_forward

    def _bps_push(self, p):
        """A gradient is complete (autograd's hook, or step() for the missing ones).  Never
        raises the background thread's error: every rank must push the same gradients (an
        error raised in one rank's backward pass would leave the others' rounds waiting)."""
        hyper = {k: v for k, v in self._cb_group(p).items() if k != "params"}  # as now
        self._cb_ready[p].clear()
        handle, ctx = super()._bps_push(p)
        with self._cb_idle:
            self._cb_inflight += 1
        self._cb_queue.put(_Pending((-self._bps_priority[p], next(self._cb_seq)), p, handle,
                                    ctx, hyper))
        return handle, ctx

    def _cb_group(self, p) -> dict:
        """``p``'s parameter group (looked up again when the groups change)."""
        ids = tuple(map(id, self.param_groups))
        if self._cb_groups_of[0] != ids:
            self._cb_groups_of = (ids, {id(q): g for g in self.param_groups
                                        for q in g["params"]})
        return self._cb_groups_of[1][id(p)]

    def step(self, closure=None):
        """Start what autograd has not pushed yet and return; the updates follow."""
        if self._bps_async:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            self._bps_push_missing()
        self._bps_handles.clear()
        _core.flush()           # what autotune held until the end of backward goes now
        self._cb_raise()        # (after this step's pushes, which every rank makes)
        self._cb_steps += 1
        _core.step_done()
        if self._cb_steps == self._cb_final:
            self.synchronize()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        """Nothing to do: each gradient is zeroed when its update has been applied."""
        if self._bps_async:
            return super().zero_grad(set_to_none=set_to_none)
        return None

    def synchronize(self) -> None:
        """Wait until every pushed gradient has been applied to its parameter."""
        if self._bps_async:
            return None
        with self._cb_idle:
            while self._cb_inflight:
                self._cb_idle.wait()
        self._cb_raise()
        return None

    def _bps_quiesce(self) -> BaseException | None:
        """Wait until no update is in flight and drop (return) a failed one's error: the
        elastic restore (``TorchState.restore``) loads the last commit over what they did."""
        if self._bps_async:
            return None
        with self._cb_idle:
            while self._cb_inflight:
                self._cb_idle.wait()
        err, self._cb_error = self._cb_error, None
        return err

    def _bps_before_shutdown(self) -> None:
        """``bps.shutdown()``: the last step's updates are applied before the job goes."""
        err = self._bps_quiesce()
        if err is not None:
            log.warning("CrossBarrier: an update failed before shutdown(): %s", err)

    def state_dict(self):
        self.synchronize()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        self.synchronize()
        return super().load_state_dict(state_dict)

    def _cb_raise(self) -> None:
        err, self._cb_error = self._cb_error, None
        if err is not None:
            raise err

    # ------------------------------------------------------------------ background thread
    def _cb_apply(self, x: _Pending) -> None:
        p, one = x.p, self._cb_alone(x.p, x.group)
        try:
            out = _synchronize(x.handle)
            with torch.no_grad():
                if x.ctx is _SPARSE:
                    p.grad = out
                elif x.ctx is not _OWN_TENSOR:
                    result = self._bps_compression.decompress(out, x.ctx)
                    if result is not p.grad:
                        p.grad.copy_(result)
                self._cb_base.step(one)
        except BaseException as exc:    # the job's error reaches the main thread
            if self._cb_error is None:
                self._cb_error = exc
            log.debug("CrossBarrier: the update of %r failed: %s", self._bps_names[p], exc)
        finally:
            self._cb_base.zero_grad(one, set_to_none=False)
            self._bps_delay[p] = self._bps_bpps
            self._cb_ready[p].set()
            with self._cb_idle:
                self._cb_inflight -= 1
                self._cb_idle.notify_all()

    def _cb_alone(self, p: torch.Tensor, hyper: dict):
        """The wrapped optimizer over ``p`` alone, with ``hyper``: its own ``step`` and
        ``zero_grad`` run on it (the state is shared)."""
        one = object.__new__(self._cb_base)
        one.__dict__.update({k: v for k, v in self.__dict__.items()
                             if not k.startswith(("_bps_", "_cb_"))})
        one.param_groups = [dict(hyper, params=[p])]
        return one


def _cb_run(ref, q: queue.SimpleQueue) -> None:
    """The background thread: applies each update once its handle is done, the most
    urgent first; ``ref`` is the CrossBarrier (weak: held only while applying)."""
    pending: list[_Pending] = []
    progress = time.monotonic()
    while True:
        block = not pending
        try:
            while True:
                item = q.get(block=block)
                block = False
                if item is None:
                    return
                bisect.insort(pending, item)
        except queue.Empty:
            pass
        done = [x for x in pending if _done(x.handle, 0)]
        if not done:
            if _done(pending[0].handle, _POLL_S):
                continue
            if time.monotonic() - progress < _STALL_S:
                continue
            done = [pending[0]]        # synchronize() blocks: deadlines, failures
        opt = ref()
        if opt is None:
            return
        for x in done:
            pending.remove(x)
            opt._cb_apply(x)
        # nothing of the optimizer's (nor its parameters, whose hooks hold it) stays here
        opt = done = x = item = None
        progress = time.monotonic()


_CLASSES: dict[type, type] = {}


def CrossBarrier(model, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step: int = 1, num_steps: int = 10**6, *,
                 compression_params: dict | None = None, algorithm=None):
    """Wrap ``optimizer`` as :func:`byteps.torch.DistributedOptimizer` does, and let the
    next forward pass of ``model`` overlap this step's exchange (see the module's doc).

    The original BytePS's signature; ``num_steps``: at that step ``step()`` waits until
    every update is applied (``synchronize()`` does it at any time).  ``compression_params``
    and ``algorithm`` are DistributedOptimizer's.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"CrossBarrier(model, optimizer, ...) expects the torch.nn.Module "
                        f"being trained first, got {type(model).__name__}")
    if isinstance(optimizer, _REFUSED):
        raise TypeError(f"CrossBarrier updates each parameter on its own as soon as its "
                        f"gradient is back; {type(optimizer).__name__} takes one step over "
                        f"all parameters together (a closure, a line search); use "
                        f"bps.DistributedOptimizer")
    if type(num_steps) is not int or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    base = type(optimizer)
    model_params = {id(p) for p in model.parameters()}
    missing = [i for g in optimizer.param_groups for i, p in enumerate(g["params"])
               if id(p) not in model_params]      # frozen ones too: they may be unfrozen
    if missing:
        raise ValueError(f"CrossBarrier: {len(missing)} of the optimizer's parameters are not "
                         f"parameters of the model passed (their forward pass could not wait "
                         f"for their update); pass the model that owns them")
    dist = DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                compression=compression,
                                backward_passes_per_step=backward_passes_per_step,
                                compression_params=compression_params, algorithm=algorithm)
    cls = _CLASSES.get(type(dist))
    if cls is None:
        cls = _CLASSES[type(dist)] = type(base.__name__, (_CrossBarrier, type(dist)),
                                          {"__module__": base.__module__,
                                           "__qualname__": base.__qualname__})
    dist.__class__ = cls
    dist._cb_setup(model, base, num_steps)
    return dist

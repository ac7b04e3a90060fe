"""Broadcast helpers: parameters, optimizer state and plain Python objects.

A broadcast is a sum in which every rank but the root contributes zeros, so
the result is the root's value bit for bit on every rank.
"""
from __future__ import annotations

import numpy as np
import torch

from byteps.core import api as _core
from byteps.torch import _objects
from byteps.torch.ops import (
    _auto_name,
    push_pull_async_inplace,
    rank,
    size,
    synchronize,
)

__all__ = ["broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
_SLOT_NUMEL = 64          # optimizer-state tensors at least this big travel as tensors




def _check_root(root_rank: int, what: str) -> None:
    n = size()
    if type(root_rank) is not int or not 0 <= root_rank < n:
        raise ValueError(f"{what}: root_rank={root_rank!r} is out of range for a job of {n} "
                         f"worker(s); use 0..{n - 1}")


def broadcast_inplace(tensors: list, root_rank: int, process_set=None) -> None:
    """Overwrite every ``(name, tensor)`` with the root's value, in place.

    One synchronous sum in which the other ranks contribute zeros, in async mode too
    (only the asynchronous algorithms' keys are asynchronous on the servers,
    docs/algorithms.md).  With a ``process_set`` other than the global one, a broadcast
    among its ranks (byteps.core.process_sets).
    """
    from byteps.core import collectives
    if collectives._set(process_set) is not None:
        from byteps.torch import compat
        hs = [compat.broadcast_async_(t, root_rank, name, process_set) for name, t in tensors]
        for h in hs:
            synchronize(h)
        return
    me = rank()
    rounds = 1
    with torch.no_grad():
        for k in range(rounds):
            if k == 1:
                _core.barrier()            # every root push has been applied by now
                if me == root_rank:
                    return
            handles = []
            for i, (name, t) in enumerate(tensors):
                if me != root_rank:
                    t.zero_()
                handles.append(push_pull_async_inplace(t, average=False, name=name,
                                                       priority=-i))
            for h in handles:
                synchronize(h)


def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter.",
                         process_set=None) -> None:
    """Overwrite ``params`` on every rank with rank ``root_rank``'s values, in place.

    ``params`` is a ``state_dict()`` (dict), a list or iterator of
    ``(name, tensor)`` pairs such as ``named_parameters()``, or a list of
    tensors.  Tensors that share memory are sent once.
    """
    _check_root(root_rank, "broadcast_parameters")
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        try:
            items = list(params)
        except TypeError:
            raise ValueError(f"broadcast_parameters: invalid params of type "
                             f"{type(params).__name__}; pass model.state_dict(), "
                             f"model.named_parameters() or a list of tensors") from None
        items = [p if isinstance(p, tuple) else (None, p) for p in items]
    seen, todo = set(), []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name or 'an entry'} is a "
                             f"{type(p).__name__}, not a tensor")
        if p.numel() == 0:
            continue
        ident = (p.device, p.untyped_storage().data_ptr() + p.storage_offset() *
                 p.element_size(), tuple(p.shape), p.dtype)
        if ident in seen:
            continue
        seen.add(ident)
        todo.append((name, p))
    broadcast_inplace([(prefix + name if name is not None else _auto_name("broadcast"), p)
                       for name, p in todo], root_rank, process_set)


def _broadcast_bytes(data: bytes | None, root_rank: int, name: str, process_set=None) -> bytes:
    is_root = rank() == root_rank
    n = torch.tensor([len(data) if is_root else 0], dtype=torch.int64)
    broadcast_inplace([(name + ".len", n)], root_rank, process_set)
    length = int(n[0])
    if not length:
        return b""
    buf = torch.from_numpy(np.frombuffer(data, np.uint8).copy()) if is_root else \
        torch.zeros(length, dtype=torch.uint8)
    broadcast_inplace([(f"{name}.data.{length}", buf)], root_rank, process_set)
    return buf.numpy().tobytes()


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, process_set=None):
    """Return rank ``root_rank``'s ``obj`` on every rank.

    ``obj`` may nest dicts, lists and tuples of None, bool, int, float, str,
    bytes, numpy arrays/scalars and torch tensors (tensors arrive on the CPU);
    anything else raises TypeError naming where it sits.  The data travels as
    msgpack, never pickle.  Without ``name``, every rank must call
    broadcast_object in the same order.
    """
    _check_root(root_rank, "broadcast_object")
    from byteps.core import collectives
    name = "broadcast_object." + (name if name is not None else
                                  collectives.auto_name("obj", process_set))
    data = _objects.encode(obj) if rank() == root_rank else None
    raw = _broadcast_bytes(data, root_rank, name, process_set)
    try:
        return _objects.decode(raw)
    except ValueError as exc:
        raise _core.BytePSError(f"broadcast_object on rank {rank()}: data from root rank "
                                f"{root_rank} is malformed: {exc}") from None


def broadcast_optimizer_state(optimizer, root_rank: int, prefix: str = "OptimizerState.",
                              model=None, process_set=None) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to rank ``root_rank``'s.

    Works for any ``torch.optim`` optimizer, also before the first step (an
    empty state is then sent as empty).  Hyper-parameters (lr, betas, ...)
    and small tensors such as step counts travel in one msgpack message;
    larger state tensors are push_pulled in place of zeros.
    """
    _check_root(root_rank, "broadcast_optimizer_state")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state expects a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not optimizer.state:
        # as Horovod and the original: parameters that will be trained get a zero .grad
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    me = rank()
    tensors: list = []
    data = None
    if me == root_rank:
        data = _objects.encode(optimizer.state_dict(), slots=tensors,
                               min_slot_numel=_SLOT_NUMEL)
    raw = _broadcast_bytes(data, root_rank, prefix + "meta", process_set)
    try:
        sd = _objects.decode(raw, allow_slots=True)
        slots = _collect_slots(sd, [])
    except ValueError as exc:
        raise _core.BytePSError(f"broadcast_optimizer_state on rank {me}: data from root "
                                f"rank {root_rank} is malformed: {exc}") from None
    slots.sort(key=lambda s: s.index)
    if [s.index for s in slots] != list(range(len(slots))) or \
            (me == root_rank and len(slots) != len(tensors)):
        raise _core.BytePSError(f"broadcast_optimizer_state on rank {me}: inconsistent tensor "
                                f"list from root rank {root_rank}")
    values = []
    for s in slots:
        if me == root_rank:
            t = tensors[s.index].detach().clone()      # never write into the live state
            if tuple(t.shape) != s.shape or str(t.dtype) != "torch." + s.dtype:
                raise _core.BytePSError(f"broadcast_optimizer_state: state tensor {s.index} "
                                        f"changed while it was being sent")
        else:
            t = torch.zeros(s.shape, dtype=getattr(torch, s.dtype))
        values.append(t)
    broadcast_inplace([(_slot_name(prefix, s), t) for s, t in zip(slots, values)], root_rank,
                      process_set)
    if me == root_rank:
        return
    state = _objects.fill_slots(sd, values)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"broadcast_optimizer_state on rank {me}: the optimizer of root rank "
                         f"{root_rank} does not match this rank's ({exc}); build the same "
                         f"optimizer over the same parameters on every rank") from None


def _slot_name(prefix: str, s: _objects.Slot) -> str:
    return f"{prefix}{s.index}.{s.dtype}.{'x'.join(map(str, s.shape)) or 'scalar'}"


def _collect_slots(obj, out: list) -> list:
    if isinstance(obj, _objects.Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)
    return out

"""Broadcast helpers: parameters, optimizer state and plain Python objects.

Every broadcast here is the core's (:func:`byteps.core.collective.ops.broadcast`: the root
rank checked once, the ranks' root, dtype and shape agreed, then a sum in which every
rank but the root contributes zeros, so the result is the root's value bit for bit);
objects travel by the core's :mod:`byteps.core.collective.objects` with torch tensors encoded.
"""
from __future__ import annotations

import torch

from byteps.core import api as _core
from byteps.core.collective import ops as _coll
from byteps.core.collective import objects as _core_objects
from byteps.torch import _objects
from byteps.torch.ops import rank, synchronize

__all__ = ["broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
_SLOT_NUMEL = 64          # optimizer-state tensors at least this big travel as tensors




def broadcast_inplace(tensors: list, root_rank: int, process_set=None) -> None:
    """Overwrite every ``(name, tensor)`` with the root's value, in place (the core's
    broadcast of each, all in flight together)."""
    from byteps.torch import compat
    hs = [compat.broadcast_async_(t, root_rank, name, process_set) for name, t in tensors]
    first = None
    for h in hs:                      # every handle is synchronized, even after an error
        try:
            synchronize(h)
        except BaseException as exc:  # noqa: BLE001 - the first error is raised below
            first = first or exc
    if first is not None:
        raise first


def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter.",
                         process_set=None) -> None:
    """Overwrite ``params`` on every rank with rank ``root_rank``'s values, in place.

    ``params`` is a ``state_dict()`` (dict), a list or iterator of
    ``(name, tensor)`` pairs such as ``named_parameters()``, or a list of
    tensors.  Tensors that share memory are sent once.
    """
    _coll.check_root(root_rank, "broadcast_parameters", _coll._set(process_set))
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
    broadcast_inplace([(prefix + name if name is not None else None, p)
                       for name, p in todo], root_rank, process_set)


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, process_set=None):
    """Return rank ``root_rank``'s ``obj`` on every rank.

    ``obj`` may nest dicts, lists and tuples of None, bool, int, float, str,
    bytes, numpy arrays/scalars and torch tensors (tensors arrive on the CPU);
    anything else raises TypeError naming where it sits.  The data travels as
    msgpack, never pickle.  Without ``name``, every rank must call
    broadcast_object in the same order.
    """
    return _core_objects.broadcast_object(obj, root_rank, name, codec=_objects.CODEC,
                                          process_set=process_set)


def broadcast_optimizer_state(optimizer, root_rank: int, prefix: str = "OptimizerState.",
                              model=None, process_set=None) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to rank ``root_rank``'s.

    Works for any ``torch.optim`` optimizer, also before the first step (an
    empty state is then sent as empty).  Hyper-parameters (lr, betas, ...)
    and small tensors such as step counts travel in one msgpack message;
    larger state tensors are push_pulled in place of zeros.
    """
    _coll.check_root(root_rank, "broadcast_optimizer_state", _coll._set(process_set))
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
    codec = (lambda o: _objects.encode(o, slots=tensors, min_slot_numel=_SLOT_NUMEL),
             lambda raw: _objects.decode(raw, allow_slots=True))
    sd = _core_objects.broadcast_object(optimizer.state_dict() if me == root_rank else None,
                                        root_rank, prefix + "meta", codec=codec,
                                        process_set=process_set)
    slots = _collect_slots(sd, [])
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

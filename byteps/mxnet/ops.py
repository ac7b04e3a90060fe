"""NDArray operations over the numpy core: push_pull in place, broadcast, names.

Names must be identical on every rank.  Gluon's parameter names carry
per-process counters (``dense3_weight``) that differ when one rank builds an
extra block, so names here are built from the parameter's *position* plus its
name with the counters removed (``gradient_0_dense_weight``).  A group of
parameters (one trainer, one broadcast) gets a prefix from the order in which
this process first met the group, so a GAN's two trainers do not collide and a
trainer re-created over the same parameters reuses its names.
"""
from __future__ import annotations

import ctypes
import re
import threading

import numpy as np

from byteps.core import api as core
from byteps.core.api import local_rank, local_size, rank, size  # noqa: F401  (the original's
from byteps.core.api.basics import init, shutdown  # noqa: F401   names here too)
from byteps.core.collective import ops as coll
from byteps.core.elastic import resume, suspend  # noqa: F401
from byteps.mxnet._mx import mx

_HOST = ("cpu", "cpu_pinned", "cpu_shared")

_GROUPS: dict[tuple, int] = {}
_LOCK = threading.Lock()
_COUNTER = re.compile(r"\d+_")


def plain_name(name) -> str:
    """``hybridsequential0_dense12_weight`` -> ``hybridsequential_dense_weight``."""
    return _COUNTER.sub("_", str(name))


def group_prefix(signature: tuple) -> str:
    """A name prefix for a group of tensors, the same on every rank that meets the
    groups in the same order ("" for the first group, like the original's names)."""
    with _LOCK:
        tag = _GROUPS.setdefault(signature, len(_GROUPS))
    return "" if tag == 0 else f"g{tag}."


def check_dense(arr, what: str):
    if not isinstance(arr, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mxnet NDArray, got {type(arr).__name__} (for "
                        f"numpy arrays use byteps.numpy)")
    if arr.stype != "default":
        raise TypeError(f"{what}: {arr.stype} NDArrays are not supported; BytePS moves dense "
                        f"tensors (use .tostype('default'))")
    return arr


def host_array(arr) -> tuple:
    """``(numpy array, shared)``: for an NDArray in host memory, a zero-copy view of
    its memory (``shared=True``), taken once MXNet's pending reads and writes of it
    are done; for other devices, a copy.  Nothing else may touch a shared view's
    NDArray until the caller has finished with the view."""
    if arr.context.device_type in _HOST and arr.stype == "default" and arr.size:
        from mxnet.base import _LIB, check_call
        check_call(_LIB.MXNDArrayWaitToWrite(arr.handle))
        ptr = ctypes.c_void_p()
        check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))  # default layout
        dt = np.dtype(arr.dtype)
        if ptr.value:
            buf = (ctypes.c_char * (arr.size * dt.itemsize)).from_address(ptr.value)
            return np.frombuffer(buf, dt).reshape(arr.shape), True
    return arr.asnumpy(), False


def writer(arrays: list, view=None):
    """A callback writing a result into every NDArray of ``arrays``, except the one whose
    memory ``view`` is when the result is ``view`` itself."""
    def write(res: np.ndarray) -> None:
        for i, a in enumerate(arrays):
            if not (i == 0 and view is not None and res is view):
                a[:] = res
    return write


def postscale(write, factor: float):
    """``write`` of the result multiplied by Horovod's ``gradient_predivide_factor``."""
    def scaled(res):
        res *= res.dtype.type(factor)
        write(res)
    return scaled


def wait_all(pending: list) -> None:
    """Synchronize every ``(handle, write)`` pair, calling ``write(result)``; all handles
    are drained even after a failure, then the first error is raised."""
    first = None
    for handle, write in pending:
        try:
            res = core.synchronize(handle)
        except core.BytePSError as exc:
            first = first or exc
            continue
        if first is None:
            write(res)
    if first is not None:
        raise first


def drain(pending: list) -> None:
    """Synchronize handles after another failure, ignoring their results."""
    for handle, _ in pending:
        try:
            core.synchronize(handle)
        except core.BytePSError:
            pass


def gradient_set(process_set):
    """``(set, outside)`` for a DistributedOptimizer/Trainer's ``process_set`` (Horovod's
    rule, as byteps.torch): the registered non-global set or None (every rank), and True
    on a rank outside the set, which then trains on its own gradients."""
    if process_set is None or getattr(process_set, "process_set_id", 0) == 0:
        return None, False
    included = getattr(process_set, "included", None)
    if callable(included) and not included():
        return None, True
    return coll._set(process_set), False


def predivide(factor, subject: str, num_groups=0) -> float:
    """Horovod's ``gradient_predivide_factor``: gradients are divided by it before the sum
    and multiplied by it after (with the average's ``1/size``); checked, with
    ``num_groups``, by the core's one rule (``check_gradient_grouping``)."""
    from byteps.core.api.basics import check_gradient_grouping
    check_gradient_grouping(subject, factor, num_groups)
    return float(factor)


def set_allreduce(arrays: list, names: list, ps, factor: float = 1.0) -> None:
    """Average each NDArray of ``arrays`` in place over the process set ``ps``."""
    for a, name in zip(arrays, names):
        res = coll.allreduce(a.asnumpy(), name, op=coll.AVERAGE, prescale_factor=1.0 / factor,
                             postscale_factor=factor, process_set=ps)
        a[:] = res.reshape(a.shape)


def byteps_push_pull(tensor, version: int = 0, priority: int = 0, name: str | None = None,
                     is_average: bool = True) -> None:
    """Sum (or average, the default) ``tensor`` across all workers, in place.

    ``name`` identifies the tensor on every rank; without one, calls are numbered
    in order (every rank must then make the same calls in the same order).
    ``version`` is accepted for compatibility and unused.
    """
    name = coll.check_name(name, "push_pull")
    check_dense(tensor, f"byteps_push_pull of tensor {name!r}")
    arr, shared = host_array(tensor)
    core.push_pull(arr, str(name), average=bool(is_average), priority=int(priority), out=arr)
    if not shared:
        tensor[:] = arr


def byteps_declare_tensor(name: str, **kwargs) -> None:
    """Declare a tensor name (optional: keys come from names, in any order)."""
    core.declare(name, **kwargs)


def broadcast_arrays(items: list, root_rank: int, process_set=None) -> None:
    """Broadcast ``[(name, [ndarray, ...]), ...]`` from ``root_rank``: the first array
    of each entry is sent, every array of the entry receives the result.  With a
    (registered, non-global) ``process_set``: among its ranks only, from ``root_rank``
    when it is one of them, else from the set's first rank (a trainer of the set)."""
    root = coll.check_root(root_rank, "broadcast_parameters")
    if core.size() == 1:
        return
    if process_set is not None:
        ranks = list(process_set.ranks)
        root = root if root in ranks else ranks[0]
        for name, arrays in items:      # once, at a trainer's start: one at a time
            writer(arrays)(coll.broadcast(host_array(arrays[0])[0], root, name,
                                          process_set=process_set))
        return
    pending = []
    try:
        for i, (name, arrays) in enumerate(items):
            view, shared = host_array(arrays[0])
            handle = core.broadcast_async(view, root, name, out=view, priority=-i)
            pending.append((handle, writer(arrays, view if shared else None)))
    except BaseException:
        drain(pending)
        raise
    wait_all(pending)


def broadcast_parameters(params, root_rank: int = 0, prefix: str | None = None) -> None:
    """Make every rank's parameters equal to rank ``root_rank``'s.

    ``params`` is a dict of name -> NDArray (e.g. Module's ``arg_params``), a dict
    of name -> gluon Parameter, or a Gluon ``ParameterDict``
    (``net.collect_params()``).  Every rank must call it with the same structure.
    A parameter whose initialisation is deferred (no input size yet) is broadcast the
    moment the first forward pass initialises it (Horovod).  ``prefix`` (Horovod's)
    names this group of parameters; without it the group is named by the order in which
    this process first broadcast it, which every rank shares.
    """
    if isinstance(params, (mx.gluon.ParameterDict, dict)):
        entries = list(params.items())
    else:
        raise TypeError(f"broadcast_parameters needs a dict or a gluon ParameterDict, got "
                        f"{type(params).__name__}")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"broadcast_parameters: prefix must be a string, got {prefix!r}")
    items, sig = [], []
    for key, value in entries:
        if isinstance(value, mx.gluon.Parameter):
            arrays = None if value._deferred_init else param_arrays(value)
        else:
            arrays = [check_dense(value, f"broadcast_parameters: parameter {key!r}")]
        items.append(arrays)
        sig.append((plain_name(key), tuple(value.shape)))
    if prefix:
        prefix = f"{prefix}."
    else:
        prefix = group_prefix(("broadcast", tuple(sig)))
    named = []
    for i, ((key, value), arrays) in enumerate(zip(entries, items)):
        name = f"{prefix}parameter_{i}_{plain_name(key)}"
        if arrays is None:
            broadcast_when_initialised(value, name, root_rank)
        else:
            named.append((name, arrays))
    broadcast_arrays(named, root_rank)
    for _, arrays in named:
        for a in arrays:
            a.wait_to_read()


def broadcast_when_initialised(param, name: str, root_rank: int, process_set=None) -> None:
    """Broadcast ``param`` from ``root_rank`` under ``name`` right after its deferred
    initialisation (the first forward pass, on every rank in the same order; among
    ``process_set``'s ranks, as :func:`broadcast_arrays`)."""
    root = coll.check_root(root_rank, "broadcast_parameters")
    finish = param._finish_deferred_init

    def finish_and_broadcast(*args, **kwargs):
        pending = bool(param._deferred_init)
        finish(*args, **kwargs)
        if pending:
            with mx.autograd.pause():
                broadcast_arrays([(name, param.list_data())], root, process_set)

    param._finish_deferred_init = finish_and_broadcast


def param_arrays(param) -> list:
    """The data arrays of an initialised gluon Parameter (one per context)."""
    try:
        return param.list_data()
    except RuntimeError as exc:
        raise ValueError(f"parameter {param.name!r} has no data: call net.initialize() "
                         f"first ({exc})") from exc

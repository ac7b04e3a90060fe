"""The GPU stage of the local reduction: NCCL inside a PCIe switch group.

For a CUDA tensor on a host whose GPUs form switch groups (see
:mod:`.topology`), :func:`push_pull_async` does what the original BytePS does:

1. NCCL reduce-scatter among the GPUs of this rank's switch group, one call
   per partition (``torch.distributed`` ``ProcessGroupNCCL`` over a
   ``FileStore`` in the host's shared-memory namespace — the default process
   group of the user is never touched);
2. copy of this rank's share to pinned host memory;
3. the CPU path (:meth:`LocalReducer.submit` with ``pre=``) sums the group
   shares across switch groups in shared memory, pushes/pulls the slices and
   gathers the result;
4. :func:`synchronize` copies the result back into the CUDA tensor.

Every call checks for CUDA and NCCL first and raises a :class:`BytePSError`
that says what is missing.  This module needs a multi-GPU machine; the CI of
this project has no GPU, so only the CPU half (``pre=``) is exercised there.
NCCL calls are issued in the caller's order, so every local rank must call
:func:`push_pull_async` for the same tensors in the same order (the usual
NCCL contract).
"""
from __future__ import annotations

import os

from byteps.common.errors import BytePSError

_GROUPS: dict = {}


def available() -> tuple[bool, str]:
    """(True, '') when torch with CUDA and NCCL is usable here, else (False, why)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return False, f"the GPU local reduction needs torch ({exc})"
    if not torch.cuda.is_available():
        return False, "the GPU local reduction needs CUDA, but torch.cuda.is_available() is False"
    if not dist.is_available() or not dist.is_nccl_available():
        return False, "the GPU local reduction needs torch.distributed with NCCL"
    return True, ""


def _group(red):
    """The NCCL process group of this rank's switch group (created once per reducer)."""
    pg = _GROUPS.get(id(red))
    if pg is not None:
        return pg
    ok, why = available()
    if not ok:
        raise BytePSError(why)
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import ProcessGroupNCCL
    g = red.mygroup
    path = os.path.join(red.dir, f"{red.prefix}nccl-g{red.groups.index(g)}")
    store = dist.FileStore(path, len(g))
    pg = ProcessGroupNCCL(dist.PrefixStore("bps", store), g.index(red.me), len(g))
    _GROUPS[id(red)] = pg
    return pg


def push_pull_async(tensor, name: str, average: bool = True, priority: int = 0) -> tuple:
    """Start the hierarchical push_pull of a CUDA tensor; returns a token for synchronize()."""
    import numpy as np
    import torch

    from byteps.core import api
    from byteps.core.local import push_pull_prereduced_async
    st = api._state()
    red = st.local
    if red is None:
        raise BytePSError(f"tensor {name!r}: the GPU path needs the local reduction "
                          f"(BYTEPS_LOCAL_SIZE > 1, BYTEPS_LOCAL_REDUCE on)")
    if not tensor.is_cuda:
        raise BytePSError(f"tensor {name!r}: expected a CUDA tensor, got {tensor.device}")
    if len(red.mygroup) == 1:
        host = tensor.detach().cpu().numpy()      # no switch peer: the plain CPU path
        return (api.push_pull_async(host, name, average, priority), tensor)
    pg = _group(red)
    flat = tensor.detach().reshape(-1).contiguous()
    like = np.empty(flat.numel(), dtype=str(flat.dtype).replace("torch.", ""))
    item = like.dtype.itemsize
    chunk = max(1, red.chunk_bytes(flat.numel() * item, name) // item)
    n, m, i = flat.numel(), len(red.mygroup), red.mygroup.index(red.me)

    owner = red.owner_of(api.tensor_key(name), n * item)

    class _Chunks:                                 # the reducer's layout, without a segment
        def split(self, j, parts, k):
            s, e = j * chunk, min(n, (j + 1) * chunk)
            return s + (e - s) * k // parts, s + (e - s) * (k + 1) // parts

        def slice(self, j, k):
            if owner is None:
                return self.split(j, red.L, k)
            s, e = j * chunk, min(n, (j + 1) * chunk)
            return (s, e) if k == owner else (s, s)
    layout = _Chunks()
    staged = {}
    pinned = torch.empty(n, dtype=flat.dtype, pin_memory=True)
    for j in range(-(-n // chunk)):
        parts = [layout.split(j, m, k) for k in range(m)] if red.two_level else \
            [layout.slice(j, k) for k in range(red.L)]
        width = max(b - a for a, b in parts)
        if width == 0:
            continue
        inp = torch.zeros(len(parts) * width, dtype=flat.dtype, device=flat.device)
        for k, (a, b) in enumerate(parts):
            inp[k * width:k * width + (b - a)] = flat[a:b]
        outp = torch.empty(width, dtype=flat.dtype, device=flat.device)
        pg._reduce_scatter_base(outp, inp).wait()
        a, b = parts[i]
        pinned[a:b].copy_(outp[:b - a], non_blocking=True)
        staged[j] = (a, b)
    torch.cuda.current_stream(flat.device).synchronize()
    host = pinned.numpy()

    def pre(j, a, b):
        if staged.get(j, (a, b)) != (a, b):
            raise BytePSError(f"tensor {name!r}: chunk {j} layout differs between the GPU "
                              f"and CPU stages")
        return host[a:b]
    return (push_pull_prereduced_async(like, name, pre, average, priority), tensor)


def synchronize(token: tuple):
    """Wait for a GPU push_pull and write the result into its CUDA tensor (returned)."""
    import torch

    from byteps.core import api
    hid, tensor = token
    res = api.synchronize(hid)
    tensor.copy_(torch.from_numpy(res).reshape(tensor.shape).to(tensor.device))
    return tensor

"""Horovod's ``SyncBatchNorm``: batch normalization whose statistics cover the batch of
every rank (of a process set), on CPU and GPU tensors alike.

Forward: one allreduce (sum) of every channel's ``[sum x, sum x^2, count]`` gives the
global mean and (biased) variance; running statistics are updated with the unbiased
variance, as ``torch.nn.BatchNorm`` does over the whole batch.  Backward: one allreduce
(sum) of ``[sum dy, sum dy * x_hat]``; the input gradient is then exactly that of a
batch norm over the concatenated batch, and the weight and bias gradients stay local
(the ``DistributedOptimizer`` averages them, as for any parameter).  In eval mode (or
without running statistics tracking in training) it is ``torch.nn.functional.batch_norm``
with no communication when the statistics are the running ones.
"""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["SyncBatchNorm"]


def _allreduce_sum(t: torch.Tensor, ps) -> torch.Tensor:
    from byteps.torch import compat
    return compat.synchronize(compat.allreduce_async(t, op=compat.Sum, process_set=ps))


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, ps):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        xd = x.detach().to(torch.float64)
        count = torch.tensor([x.numel() // c], dtype=torch.float64)
        stats = _allreduce_sum(torch.cat([xd.sum(dims), (xd * xd).sum(dims), count]), ps)
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * n / (n - 1) if n > 1 else var
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        invstd = (var + eps).rsqrt()
        xhat = (xd - mean.view(shape)) * invstd.view(shape)
        f64 = torch.float64
        w = weight.detach().to(f64) if weight is not None else torch.ones(c, dtype=f64)
        b = bias.detach().to(f64) if bias is not None else torch.zeros(c, dtype=f64)
        ctx.save_for_backward(xhat, invstd, w)
        ctx.n, ctx.ps, ctx.dims, ctx.shape = n, ps, dims, shape
        ctx.affine = (weight is not None, bias is not None)
        return (xhat * w.view(shape) + b.view(shape)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, w = ctx.saved_tensors
        dims, shape, c = ctx.dims, ctx.shape, w.numel()
        dyd = dy.to(torch.float64)
        sum_dy, sum_dy_xhat = dyd.sum(dims), (dyd * xhat).sum(dims)
        g = _allreduce_sum(torch.cat([sum_dy, sum_dy_xhat]), ctx.ps)
        gdy, gdyx = g[:c], g[c:]
        dx = (w * invstd).view(shape) / ctx.n * (ctx.n * dyd - gdy.view(shape) -
                                                  xhat * gdyx.view(shape))
        dw = sum_dy_xhat.to(dy.dtype) if ctx.affine[0] else None
        db = sum_dy.to(dy.dtype) if ctx.affine[1] else None
        return dx.to(dy.dtype), dw, db, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of every rank of ``process_set`` (default:
    every worker); the arguments are ``torch.nn.BatchNorm*``'s."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _set_size(self) -> int:
        from byteps.torch import compat
        return compat._set_size(self.process_set)

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None \
                else self.momentum
        use_batch = self.training or not self.track_running_stats
        if not use_batch or self._set_size() == 1:
            return torch.nn.functional.batch_norm(
                input, self.running_mean if not use_batch or self.track_running_stats else None,
                self.running_var if not use_batch or self.track_running_stats else None,
                self.weight, self.bias, use_batch, factor, self.eps)
        track = self.track_running_stats
        return _SyncBN.apply(input, self.weight, self.bias,
                             self.running_mean if track else None,
                             self.running_var if track else None, self.eps, factor,
                             self.process_set)

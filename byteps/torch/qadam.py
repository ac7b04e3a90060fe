"""QAdam / 1-bit Adam (Bagua's ``QAdamOptimizer``), for ``bps.DistributedOptimizer``.

    opt = bps.QAdamOptimizer(model.parameters(), lr=1e-3, warmup_steps=100)
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())

For the first ``warmup_steps`` steps it is Adam on the averaged full-precision
gradients.  Then the second moment (variance) is frozen, and each worker updates
its first moment (momentum) with its own gradient and the *momentum* is averaged
across workers, compressed with onebit + error feedback in the core
(``compression_params``, default ``{"compressor": "onebit", "ef": "vanilla"}``),
as Bagua's QAdam and 1-bit Adam do.  Every rank ends each step with the same
parameters.  Without DistributedOptimizer (one process) it is Adam with the
variance frozen after warm-up.
"""
from __future__ import annotations

import sys

import torch

__all__ = ["QAdamOptimizer"]

DEFAULT_COMPRESSION = {"compressor": "onebit", "ef": "vanilla"}


class QAdamOptimizer(torch.optim.Optimizer):
    """Adam whose momentum, after ``warmup_steps``, is what workers exchange (compressed)."""

    def __init__(self, params, lr: float = 1e-3, warmup_steps: int = 100,
                 betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 compression_params: dict | None = None):
        if not lr > 0:
            raise ValueError(f"QAdamOptimizer: lr must be > 0, got {lr!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) \
                or warmup_steps < 1:
            raise ValueError(f"QAdamOptimizer: warmup_steps must be an int >= 1 (full-precision "
                             f"Adam steps before the variance is frozen), got {warmup_steps!r}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"QAdamOptimizer: betas must be in [0, 1), got {betas!r}")
        self.warmup_steps = warmup_steps
        self.compression_params = dict(compression_params or DEFAULT_COMPRESSION)
        from byteps import compression
        compression.parse(self.compression_params)     # a clear error now
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def _state(self, p) -> dict:
        st = self.state[p]
        if not st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["synced"] = False
        return st

    def _group(self, p) -> dict:
        for g in self.param_groups:
            if any(q is p for q in g["params"]):
                return g
        raise KeyError("parameter not in this optimizer")

    def _bps_comm(self, p):
        """DistributedOptimizer's hook: after warm-up, exchange the momentum instead of the
        gradient.  Returns ``(tensor, name prefix, compression_params)`` or None."""
        st = self._state(p)
        if st["step"] < self.warmup_steps:
            return None
        g = self._group(p)
        grad = p.grad
        if g["weight_decay"]:
            grad = grad.add(p.detach(), alpha=g["weight_decay"])
        st["exp_avg"].mul_(g["betas"][0]).add_(grad, alpha=1 - g["betas"][0])
        st["synced"] = True
        return st["exp_avg"], "QAdam.exp_avg.", self.compression_params

    @torch.no_grad()
    def step(self, closure=None):
        """One QAdam step (see the module docstring)."""
        _refuse_grad_scaler(self)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state(p)
                st["step"] += 1
                grad = p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                if st["step"] <= self.warmup_steps:
                    st["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                else:
                    if not st["synced"]:         # no DistributedOptimizer: local momentum
                        st["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
                    # elements that never had a gradient (frozen variance 0) stay put: the
                    # compressed momentum's noise there would be divided by eps
                    st["exp_avg"].masked_fill_(st["exp_avg_sq"] == 0, 0.0)
                st["synced"] = False
                bc1 = 1 - b1 ** st["step"]
                bc2 = 1 - b2 ** min(st["step"], self.warmup_steps)     # frozen variance
                denom = (st["exp_avg_sq"] / bc2).sqrt_().add_(group["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / bc1)
        return loss


def _refuse_grad_scaler(opt) -> None:
    """``scaler.step(opt)`` of a ``torch.amp.GradScaler`` (found among the callers, through
    DistributedOptimizer's step): refused by the core's rule, before any step."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return
        if isinstance(frame.f_locals.get("self"), torch.amp.GradScaler):
            from byteps.core import compat
            compat.refuse("qadam-loss-scale", f"GradScaler.step({type(opt).__name__})")
        frame = frame.f_back

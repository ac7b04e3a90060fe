"""Loss scaling around a byteps optimizer (Keras 3).

Horovod's order, ``DistributedOptimizer(LossScaleOptimizer(opt))``, averages the scaled
gradients first; an overflow on one rank makes the average inf on every rank, so every
rank's scaler skips the step.  The other order is what ``model.compile`` builds under the
``mixed_float16`` dtype policy: ``LossScaleOptimizer(DistributedOptimizer(opt))``.  There
the scaler checks its own rank's gradients and calls the inner optimizer only when they
are finite, so a rank that overflowed would skip its exchange while the others waited for
it (and the ranks' rounds would part).  :func:`adopt` makes that check the job's: the
scaler skips a step on every rank when any rank's gradients overflowed (one float summed
over the ranks), so both orders train alike, and a QAdamOptimizer inside forms its
momentum from unscaled gradients of the steps every rank applies.
"""
from __future__ import annotations

import sys

import tensorflow as tf


def adopt(opt, depth: int = 2) -> None:
    """Called from ``opt.build``: when the caller ``depth`` frames up is a Keras
    LossScaleOptimizer building ``opt`` as its inner optimizer, make its finiteness check
    agree across the workers (of ``opt``'s process set)."""
    try:
        outer = sys._getframe(depth).f_locals.get("self")
    except ValueError:
        return
    if getattr(outer, "inner_optimizer", None) is not opt or \
            not callable(getattr(outer, "check_finite", None)) or \
            getattr(outer, "_bps_agreed", False):
        return
    local = outer.check_finite
    st = opt._bps
    name = f"{st.prefix}loss_scale.nonfinite"

    def check_finite(grads):
        """Finite on every rank: the scaler applies the step everywhere or nowhere."""
        from byteps.tensorflow import mpi_ops
        bad = tf.reshape(tf.cast(tf.logical_not(local(grads)), tf.float32), [1])
        total = mpi_ops.allreduce(bad, op=mpi_ops.Sum, name=name,
                                  process_set=st.process_set)
        return tf.equal(total[0], 0.0)

    object.__setattr__(outer, "check_finite", check_finite)
    object.__setattr__(outer, "_bps_agreed", True)

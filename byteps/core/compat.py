"""The combinations of features that cannot work, each refused by one rule.

Every feature of byteps composes with every other one (docs/compatibility.md).  Where a
combination truly cannot work, it is refused here and nowhere else: a caller names the
rule and what it was asked to do, :func:`refuse` raises the one error, with the reason
and the fix.  ``tests/test_compatibility.py`` regenerates docs/compatibility.md's table
from :data:`RULES` and fails when the document differs.

"Not available yet" is never a reason: a rule states why the combination has no meaning
or cannot be exact.  Imports nothing of the worker, so any floor can use it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from byteps.common.errors import BytePSError


@dataclass(frozen=True)
class Rule:
    """One refused combination: ``what`` (the features), ``reason`` (why it cannot work)
    and ``fix`` (what the user does instead)."""

    id: str
    what: str
    reason: str
    fix: str
    error: type = BytePSError


_RULES = (
    Rule("async-average",
         "asynchronous push_pull (BYTEPS_ENABLE_ASYNC=1, AsyncPS) with average=True",
         "an asynchronous push adds this worker's delta to the servers' value at once and "
         "the pull returns that value; there is no round whose sum could be divided by the "
         "number of workers",
         "pass average=False and push parameter deltas (AsyncPS does), or unset "
         "BYTEPS_ENABLE_ASYNC to average synchronously"),
    Rule("async-op",
         "asynchronous push_pull with a reduction other than a sum (min, max, product)",
         "an asynchronous key accumulates deltas one push at a time; min, max and product of "
         "a running value with deltas have no meaning",
         "use op=Sum for asynchronous keys, or a synchronous push_pull for min/max/product",
         ValueError),
    Rule("op-average",
         "push_pull with op min, max or product and average=True",
         "an average divides a sum; a minimum, maximum or product is not a sum",
         "pass average=False (or op=Average / op=Sum)", ValueError),
    Rule("op-compression",
         "push_pull with op min, max or product and gradient compression",
         "compressors (onebit, topk, int8, ...) approximate a sum with error feedback; the "
         "error of a compressed minimum or product is not carried to the next round",
         "drop compression_params for this tensor (compression is for summed gradients)",
         ValueError),
    Rule("algorithm-momentum",
         "compressor momentum (compression_params 'momentum': 'nesterov') with an algorithm "
         "that exchanges parameters or parameter differences (AsyncPS, AsyncModelAverage, "
         "DiLoCo, Decentralized)",
         "compressor momentum accumulates gradients before they are compressed; a parameter "
         "difference already carries the optimizer's momentum, and accumulating it again "
         "would apply every step's update many times over",
         "drop 'momentum' (and 'mu') from compression_params and keep the optimizer's own "
         "momentum", ValueError),
    Rule("process-set-algorithm",
         "DistributedOptimizer(process_set=...) with an algorithm other than SyncPS "
         "(AsyncPS, AsyncModelAverage, DiLoCo, Decentralized)",
         "these algorithms keep one value per name on the servers for every worker of the "
         "job (a server round or an asynchronous key counts every worker) or run a peer "
         "topology over every rank; a process set is a subset of the workers, which "
         "neither the servers' keys nor the peer rings can tell apart",
         "use SyncPS (the default) with process_set, or drop process_set to train every "
         "worker with the algorithm", ValueError),
    Rule("algorithm-param-group",
         "optimizer.add_param_group() on a DistributedOptimizer with an algorithm other "
         "than SyncPS (AsyncPS, AsyncModelAverage, DiLoCo, Decentralized)",
         "these algorithms exchange parameters, not gradients, in rounds set up over the "
         "parameters they were given: the servers' copies seeded from rank 0 (AsyncPS, "
         "DiLoCo's global parameters and outer momentum), DiLoCo's fragments, the averaging "
         "rounds' snapshots; a parameter added during training would enter in the middle "
         "of a round, with no round-start value to take its difference from",
         "add every group before wrapping the optimizer, or call finish() and wrap the "
         "optimizer again with the algorithm after adding the group (its rounds then start "
         "over every parameter); SyncPS (the default) takes new groups as they come",
         ValueError),
    Rule("async-wrapper",
         "asynchronous training (BYTEPS_ENABLE_ASYNC=1) with a wrapper that averages "
         "gradients inside the framework's step: torch DistributedDataParallel, "
         "TensorFlow's MirroredStrategy (byteps.tensorflow.distribute)",
         "these wrappers hand the framework one averaged gradient and let its optimizer "
         "apply it; asynchronous training pushes each worker's parameter change after its "
         "own optimizer step, which happens outside the wrapper, so the wrapper has nothing "
         "to push and would silently train synchronously",
         "wrap the optimizer instead (DistributedOptimizer, or DistributedGradientTape), "
         "which trains asynchronously with the variable set, or unset BYTEPS_ENABLE_ASYNC"),
    Rule("adasum-compression",
         "Adasum (op=Adasum, bps.algorithms.Adasum) with gradient compression "
         "(compression_params, Compression.fp16)",
         "Adasum combines every rank's whole parameter change by dot products of the exact "
         "vectors (one allgather); the compressors approximate a sum through the servers and "
         "carry their error into the next round's sum, which Adasum never forms",
         "drop compression_params (or use op=Average with compression)", ValueError),
    Rule("adasum-v1-optimizer",
         "op=Adasum with a TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer)",
         "byteps wraps a TF1 optimizer by exchanging its gradients inside compute_gradients; "
         "Adasum combines the parameter change of the optimizer's own apply step, which "
         "happens after that exchange, in a separate graph op the wrapper does not run",
         "use a Keras optimizer (tf.keras.optimizers.*: op=Adasum runs bps.algorithms.Adasum "
         "on it) or DistributedGradientTape(op=Adasum)", ValueError),
    Rule("adasum-tape",
         "DistributedGradientTape(algorithm=bps.algorithms.Adasum())",
         "the tape returns gradients that the caller applies after gradient() returns, so a "
         "step's parameter change could only be combined at the next tape, after the next "
         "forward pass already used the uncombined parameters",
         "DistributedGradientTape(op=hvd.Adasum): the gradients are combined with Adasum "
         "before they are returned, as Horovod's tape does", ValueError),
    Rule("qadam-algorithm",
         "QAdamOptimizer (1-bit Adam) with an algorithm other than SyncPS (AsyncPS, "
         "BYTEPS_ENABLE_ASYNC=1, AsyncModelAverage, DiLoCo, Decentralized)",
         "QAdam is a synchronous method: every step all workers average their Adam momentum "
         "(compressed) under one variance frozen on every rank; these algorithms exchange "
         "parameters or parameter differences instead, so there is no averaged momentum "
         "for QAdam to compress and it would be plain local Adam",
         "use Adam with the algorithm and the algorithm's compression_params (AsyncPS "
         "compresses its parameter differences with error feedback), or QAdam with SyncPS "
         "(no algorithm, BYTEPS_ENABLE_ASYNC unset)"),
    Rule("qadam-loss-scale",
         "QAdamOptimizer under a loss scaler that acts after the exchange: torch's GradScaler, "
         "or Keras's LossScaleOptimizer inside the DistributedOptimizer "
         "(DistributedOptimizer(LossScaleOptimizer(QAdam)))",
         "after its warm-up QAdam forms each worker's momentum from the gradient the backward "
         "pass hands the exchange and averages that momentum; there the gradient is still "
         "multiplied by the loss scale, which changes during training, and an overflowed "
         "step is in the momentum before the scaler, which divides the scale out and skips "
         "overflowed steps only afterwards, sees it",
         "Keras: let the LossScaleOptimizer wrap the DistributedOptimizer "
         "(LossScaleOptimizer(DistributedOptimizer(QAdam)), which model.compile builds under "
         "the mixed_float16 policy): it unscales first and skips a step on every rank when "
         "any rank overflowed; torch: Adam or SGD with GradScaler, or QAdam under bfloat16 "
         "autocast, which needs no loss scaling"),
)

#: every rule by id, in the order docs/compatibility.md lists them
RULES: dict[str, Rule] = {r.id: r for r in _RULES}


def refuse(rule_id: str, subject: str) -> NoReturn:
    """Raise the error of rule ``rule_id``; ``subject`` names the tensor, rank or object
    that asked (``"tensor 'w' on rank 1"``)."""
    r = RULES[rule_id]
    raise r.error(f"{subject}: {r.what} is refused: {r.reason}. Fix: {r.fix} "
                  f"(docs/compatibility.md, rule {r.id!r})")


def markdown_table() -> str:
    """docs/compatibility.md's table of refused combinations, generated from RULES."""
    rows = ["| rule | combination | why it cannot work | instead |", "|---|---|---|---|"]
    rows += [f"| `{r.id}` | {r.what} | {r.reason} | {r.fix} |" for r in RULES.values()]
    return "\n".join(rows) + "\n"


def write_document(path: str = "docs/compatibility.md") -> None:
    """Rewrite the table between the ``rules`` markers of ``path`` from RULES
    (``python -m byteps.core.compat``)."""
    begin, end = "<!-- rules:begin -->", "<!-- rules:end -->"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + markdown_table() + end + tail)


if __name__ == "__main__":
    write_document()

"""The chaos harness's training job (benchmarks/chaos.py): full-batch least squares.

    chaos_job.py OUT STEPS

Every step sums each rank's share of the gradient of one 96-row global batch, so the
result does not depend on the number of workers (elastic churn keeps it): the final
``w`` must equal a one-process run of STEPS steps (:func:`reference`).  Each worker
writes OUT/rank<r>.json.  ``CHAOS_RAISE_AT=<step>`` makes the process that started as rank 0
raise ``ChaosError`` in that step (a worker that fails mid-step).
"""
import json
import os
import sys
import time

import numpy as np

LR = np.float32(0.05)


def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((96, 40)).astype(np.float32)
    return X, X @ rng.standard_normal(40).astype(np.float32)


def reference(steps: int) -> np.ndarray:
    X, y = data()
    w = np.zeros(40, np.float32)
    for _ in range(steps):
        w -= LR * (X.T @ (X @ w - y) / np.float32(96))
    return w


class ChaosError(RuntimeError):
    pass


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    raise_at = int(os.environ.get("CHAOS_RAISE_AT", "-1"))
    import byteps.numpy as bps
    X, y = data()
    bps.init()
    raiser = bps.rank() == 0 and raise_at >= 0     # this process (its rank may change)
    w = np.zeros(40, np.float32)
    state = bps.elastic.NumpyState({"w": w}, step=0)

    @bps.elastic.run
    def train(state):
        while state.step < steps:
            if state.step == raise_at and raiser:
                raise ChaosError(f"chaos: rank 0 raises in step {state.step}")
            rows = np.array_split(np.arange(96), bps.size())[bps.rank()]
            g = X[rows].T @ (X[rows] @ w - y[rows]) / np.float32(96)
            g = bps.push_pull(g.astype(np.float32), name="grad.w", average=False)
            w[:] -= LR * g
            state.step += 1
            state.commit()
            time.sleep(0.02)

    train(state)
    with open(os.path.join(out, f"rank{bps.rank()}.json"), "w") as f:
        json.dump({"size": bps.size(), "w": w.tolist()}, f)
    bps.shutdown()


if __name__ == "__main__":
    main()

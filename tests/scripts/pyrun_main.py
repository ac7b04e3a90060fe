"""Horovod's ``horovod.run`` pattern (its examples' ``--num-proc``), with byteps.run: the
function is defined in ``__main__`` and the call sits under the ``__main__`` guard.

    pyrun_main.py ok|fail|far [pickle]

``pickle``: cloudpickle hidden, so the plain-pickle path (the main module imported in
each worker) runs.  Prints ``RESULTS <json>`` (ok) or the error (fail, far).
"""
import json
import sys

if sys.argv[2:] == ["pickle"]:
    sys.modules["cloudpickle"] = None          # import cloudpickle now raises ImportError

import byteps


def train(scale, fail_rank=-1):
    import numpy as np

    import byteps.numpy as bps
    bps.init()
    if bps.rank() == fail_rank:
        raise RuntimeError(f"rank {bps.rank()} fails on purpose")
    out = bps.push_pull(np.full(3, bps.rank() + 1.0, np.float32), name="x", average=False)
    rank = bps.rank()
    bps.shutdown()
    return rank, (out * scale).tolist()


if __name__ == "__main__":
    mode = sys.argv[1]
    try:
        if mode == "ok":
            print("RESULTS", json.dumps(byteps.run(train, args=(2.0,), np=3)), flush=True)
        elif mode == "fail":
            byteps.run(train, args=(1.0,), kwargs={"fail_rank": 1}, np=2)
        else:
            byteps.run(train, args=(1.0,), np=2, hosts="localhost:1,gpu-box-7:1")
    except (RuntimeError, ValueError) as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)

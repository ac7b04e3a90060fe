"""Synthetic TensorFlow benchmark: byteps.tensorflow vs MultiWorkerMirroredStrategy.

In the spirit of BytePS's ``example/tensorflow/synthetic_benchmark.py``:
synthetic 32x32 images, a model chosen by name, warm-up steps, then img/sec
per worker and in total.  One invocation measures, on the same machine and
one after the other, with W workers each:

* ``nocomm``  W independent processes training without communication
               (the physical limit of this machine for W workers),
* ``byteps``  ``bpslaunch --standalone`` with W workers and S servers; the
               step is a ``tf.function`` with ``bps.DistributedGradientTape``,
* ``mwms``    ``tf.distribute.MultiWorkerMirroredStrategy`` with its CPU ring
               collective, W processes, ``TF_CONFIG`` on loopback,
* ``byteps_sync`` (only with ``--modes``) byteps starting all push_pulls after
               backward, to measure what the overlap gains,

and prints a table with the ratios byteps/mwms and byteps/nocomm.  Every
system runs the same Keras model, SGD with momentum, and the same per-worker
batch.  Each system runs ``--repeats`` times, interleaved, and the best run
is reported (the machine may be shared); a run's rate comes from its median
step time.

    python benchmarks/tf_synthetic.py --model mlp --num-workers 2
    python benchmarks/tf_synthetic.py --model deep_mlp --modes byteps,byteps_sync
Results go to results/tf_synthetic-<model>.json (or --json PATH).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "cnn", "deep_mlp")
MODES = ("nocomm", "byteps", "mwms", "byteps_sync")


def build_model(keras, name: str):
    L = keras.layers
    if name == "mlp":
        return keras.Sequential([keras.Input((32, 32, 3)), L.Flatten(),
                                 L.Dense(1024, activation="relu"),
                                 L.Dense(1024, activation="relu"), L.Dense(10)])
    if name == "cnn":
        return keras.Sequential([keras.Input((32, 32, 3)),
                                 L.Conv2D(32, 3, padding="same", activation="relu"),
                                 L.MaxPooling2D(), L.Conv2D(64, 3, padding="same",
                                                            activation="relu"),
                                 L.MaxPooling2D(), L.Flatten(), L.Dense(512, activation="relu"),
                                 L.Dense(10)])
    if name == "deep_mlp":
        return keras.Sequential([keras.Input((32, 32, 3)), L.Flatten()]
                                + [L.Dense(1024, activation="relu") for _ in range(8)]
                                + [L.Dense(10)])
    raise SystemExit(f"unknown --model {name!r}; choose one of {', '.join(MODELS)}")


# ------------------------------------------------------------------ worker side
def run_worker(args) -> None:
    mode = args.worker
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = None
    if mode == "mwms":       # must exist before any other TF op
        impl = tf.distribute.experimental.CommunicationImplementation.RING
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl))
        rank, size = args.rank, args.world
    elif mode in ("byteps", "byteps_sync"):
        import byteps.tensorflow as bps
        from byteps.tensorflow import _ops
        bps.init()
        rank, size = bps.rank(), bps.size()
    else:
        rank, size = args.rank, args.world
    import keras
    keras.utils.set_random_seed(0)
    x = tf.random.normal([args.batch_size, 32, 32, 3])
    y = tf.random.uniform([args.batch_size], 0, 10, tf.int64)
    global_batch = args.batch_size * (size if mode == "mwms" else 1)

    def loss_of(model):
        per = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                           from_logits=True)
        return tf.reduce_sum(per) / global_batch

    if strategy is not None:
        with strategy.scope():
            model = build_model(keras, args.model)
            opt = keras.optimizers.SGD(0.01, momentum=0.9)
            opt.build(model.trainable_variables)

        def replica_step():
            with tf.GradientTape() as tape:
                loss = loss_of(model)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables))

        @tf.function
        def step():
            strategy.run(replica_step)
    else:
        model = build_model(keras, args.model)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_of(model)
            if mode == "byteps":
                tape = bps.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            if mode == "byteps_sync":    # no overlap: start communicating after backward
                with tf.control_dependencies(grads):
                    grads = [tf.identity(g) for g in grads]
                grads = _ops.push_pull_grads(grads, model.trainable_variables, "Sync.",
                                             bps.Compression.none, False, bps.Average)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        if mode != "nocomm":
            opt.build(model.trainable_variables)
            bps.broadcast_variables(model.variables, root_rank=0)

    for _ in range(args.num_warmup):
        step()
    if mode.startswith("byteps"):
        bps.barrier()
    times = []
    for _ in range(args.num_iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    nparams = sum(int(v.numpy().size) for v in model.trainable_variables)
    res = {"rank": rank, "size": size, "img_per_sec": args.batch_size / med, "step_s": med,
           "step_s_mean": sum(times) / len(times), "params": nparams, "step_times": times}
    Path(f"{args.result_file}.{rank}").write_text(json.dumps(res))
    if mode.startswith("byteps"):
        bps.shutdown()


# ------------------------------------------------------------------ driver side
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "BYTEPS_")) and k != "TF_CONFIG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def _worker_argv(args, mode: str, result: str, extra=()) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--model",
            args.model, "--batch-size", str(args.batch_size), "--num-iters",
            str(args.num_iters), "--num-warmup", str(args.num_warmup), "--threads",
            str(args.threads), "--result-file", result, *extra]


def _collect(result: str, workers: int, what: str) -> list[dict]:
    out = []
    for r in range(workers):
        p = Path(f"{result}.{r}")
        if not p.exists():
            raise SystemExit(f"{what}: worker rank {r} wrote no result ({p})")
        out.append(json.loads(p.read_text()))
    return out


def run_byteps(args, tmp: str, tag: str, mode: str = "byteps") -> list[dict]:
    result = os.path.join(tmp, tag)
    cmd = [sys.executable, "-m", "byteps.launcher", "--standalone", "--num-workers",
           str(args.num_workers), "--hosts", str(args.num_workers), "--num-servers",
           str(args.num_servers), *_worker_argv(args, mode, result)]
    try:
        p = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True,
                           timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{tag}: timed out after {args.timeout:g} s") from None
    if p.returncode != 0:
        raise SystemExit(f"{tag} failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-3000:]}")
    return _collect(result, args.num_workers, tag)


def run_group(args, tmp: str, mode: str, tag: str) -> list[dict]:
    """W plain processes: MultiWorkerMirroredStrategy, or no communication at all."""
    result = os.path.join(tmp, tag)
    w = args.num_workers
    hosts = [f"127.0.0.1:{p}" for p in _free_ports(w)]
    procs = []
    for r in range(w):
        tf_config = json.dumps({"cluster": {"worker": hosts},
                                "task": {"type": "worker", "index": r}})
        env = _env(TF_CONFIG=tf_config) if mode == "mwms" else _env()
        procs.append(subprocess.Popen(
            _worker_argv(args, mode, result, ["--rank", str(r), "--world", str(w)]),
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + args.timeout
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{tag}: timed out after {args.timeout:g} s") from None
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"{tag}: worker {r} failed (rc={p.returncode}):\n{out[-3000:]}")
    return _collect(result, w, tag)


def summarize(runs: list[list[dict]]) -> dict:
    best = max(runs, key=lambda rs: sum(r["img_per_sec"] for r in rs))
    return {"total_img_per_sec": sum(r["img_per_sec"] for r in best),
            "per_worker_img_per_sec": [r["img_per_sec"] for r in best],
            "step_s": [r["step_s"] for r in best], "params": best[0]["params"],
            "all_runs_total": [sum(r["img_per_sec"] for r in rs) for rs in runs]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=MODELS)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--num-servers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--num-iters", type=int, default=30)
    ap.add_argument("--num-warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="TF intra-op threads per worker")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="nocomm,byteps,mwms",
                    help="any of " + ",".join(MODES) + " (byteps_sync: communicate only "
                    "after backward, to measure the overlap)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", default=None)
    # worker-side options
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args)
    modes = [m for m in args.modes.split(",") if m]
    bad = set(modes) - set(MODES)
    if bad:
        raise SystemExit(f"unknown --modes {sorted(bad)}; choose from {MODES}")
    runs: dict[str, list] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for m in modes:
                tag = f"{m}{rep}"
                runs[m].append(run_byteps(args, tmp, tag, m) if m.startswith("byteps")
                               else run_group(args, tmp, m, tag))
    res = {m: summarize(r) for m, r in runs.items()}
    out = {"model": args.model, "num_workers": args.num_workers,
           "num_servers": args.num_servers, "batch_size": args.batch_size,
           "num_iters": args.num_iters, "threads": args.threads, "cpus": os.cpu_count(),
           "load_avg": os.getloadavg(), "results": res, "ratios": {}}
    if "byteps" in res:
        for other in ("mwms", "nocomm", "byteps_sync"):
            if other in res:
                out["ratios"][f"byteps/{other}"] = (res["byteps"]["total_img_per_sec"]
                                                    / res[other]["total_img_per_sec"])
    params = next(iter(res.values()))["params"]
    print(f"\nTF synthetic benchmark: model={args.model} ({params / 1e6:.2f} M params, "
          f"{params * 4 / 2**20:.1f} MiB of gradients), {args.num_workers} workers, "
          f"batch {args.batch_size}/worker, {args.num_servers} byteps server(s)")
    print(f"{'system':<10}{'img/sec total':>15}{'img/sec/worker':>16}{'step ms':>10}"
          f"{'vs byteps':>11}")
    for m, r in res.items():
        rel = (res["byteps"]["total_img_per_sec"] / r["total_img_per_sec"]
               if "byteps" in res else float("nan"))
        print(f"{m:<10}{r['total_img_per_sec']:>15.1f}"
              f"{r['total_img_per_sec'] / args.num_workers:>16.1f}"
              f"{1000 * statistics.mean(r['step_s']):>10.1f}{rel:>10.2f}x")
    for k, v in out["ratios"].items():
        print(f"ratio {k}: {v:.2f}")
    suffix = "" if modes == ["nocomm", "byteps", "mwms"] else "-" + "-".join(modes)
    path = Path(args.json or ROOT / "results" / f"tf_synthetic-{args.model}{suffix}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Check byteps.torch's CUDA staging path on a machine with a GPU (CPU-only boxes skip).

    python benchmarks/gpu_check_torch.py          # local size-1 job, then 2 workers + 1 server

Exercises push_pull / push_pull_inplace / async of CUDA tensors (float32,
bfloat16, fp16 compression, non-contiguous), DistributedOptimizer on a CUDA
model, broadcast_parameters and broadcast_optimizer_state with CUDA state, in
a local job of size 1 and in a ``bpslaunch --standalone`` job of 2 workers
sharing GPU 0.  Prints one line per check and the time of a 64 MiB push_pull;
exits non-zero on any failure, 2 when CUDA is not available.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def checks() -> None:
    import torch

    import byteps.torch as bps
    bps.init()
    r, n = bps.rank(), bps.size()
    dev = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    mean = sum(range(1, n + 1)) / n

    def ok(name: str, cond: bool) -> None:
        print(f"rank {r}: {'PASS' if cond else 'FAIL'} {name}", flush=True)
        if not cond:
            raise SystemExit(1)

    x = torch.full((1000,), float(r + 1), device=dev)
    y = bps.push_pull(x, name="gpu.f32")
    ok("push_pull float32 stays on the GPU and averages",
       y.is_cuda and torch.allclose(y, torch.full_like(y, mean)))
    z = torch.full((3, 5), float(r + 1), device=dev, dtype=torch.bfloat16)
    ok("push_pull_inplace bfloat16", bps.push_pull_inplace(z, name="gpu.bf16") is z and
       z.dtype == torch.bfloat16 and torch.allclose(z.float(), torch.full((3, 5), mean,
                                                                           device=dev)))
    nc = torch.full((4, 6), float(r + 1), device=dev).t()
    bps.push_pull_inplace(nc, name="gpu.noncontig")
    ok("non-contiguous in place", torch.allclose(nc, torch.full_like(nc, mean)))
    h = bps.push_pull_async(x * 2, name="gpu.async", average=False)
    ok("async sum", torch.allclose(bps.synchronize(h), torch.full_like(x, 2 * n * mean)))
    f = bps.push_pull(x, name="gpu.fp16", compression=bps.Compression.fp16)
    ok("fp16 compression", f.dtype == torch.float32 and f.is_cuda and
       torch.allclose(f, torch.full_like(f, mean), rtol=1e-3))

    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).to(dev)
    opt = bps.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 32, device=dev) * (r + 1)).pow(2).mean().backward()
        opt.step()
    bps.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    state = torch.cat([v.reshape(-1).float() for s in opt.state.values()
                       for v in s.values() if torch.is_tensor(v)])
    both = torch.cat([flat, state])
    total = bps.push_pull(both, name="gpu.check.params", average=False)
    ok("DistributedOptimizer + broadcasts on CUDA: identical parameters and state",
       all(p.is_cuda for p in model.parameters()) and torch.allclose(total, both * n))

    big = torch.ones(16 << 20, device=dev)           # 64 MiB
    bps.push_pull_inplace(big, name="gpu.big")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        bps.push_pull_inplace(big, name="gpu.big")
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 3
    print(f"rank {r}: 64 MiB CUDA push_pull {dt * 1e3:.1f} ms ({64 / dt:.0f} MiB/s incl. "
          f"staging), {n} worker(s)", flush=True)
    bps.shutdown()


def main() -> int:
    if "--worker" in sys.argv:
        checks()
        return 0
    import torch
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check on this machine")
        return 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    me = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    print("== local job (size 1)", flush=True)
    rc = subprocess.run(me, env=env, timeout=300, check=False).returncode
    print("== bpslaunch --standalone, 2 workers, 1 server", flush=True)
    rc2 = subprocess.run([sys.executable, "-m", "byteps.launcher", "--standalone",
                          "--num-workers", "2", "--hosts", "2", "--num-servers", "1",
                          *me], env=env,
                         timeout=300, check=False).returncode
    print("ALL PASS" if rc == rc2 == 0 else f"FAILED (local rc={rc}, job rc={rc2})")
    return 0 if rc == rc2 == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

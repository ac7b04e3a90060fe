"""One rank of the torch.distributed gloo all_reduce baseline.

argv: size_bytes iters warmup.  Rank, world size and the rendezvous come
from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME picks
the link.  Prints ``CLUSTER_RESULT {json}`` like bench_pushpull.py.
"""
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    nbytes, iters, warmup = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=120))
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((max(1, nbytes // 4),), float(r + 1))
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    times = []
    cpu0 = time.process_time()
    for _ in range(iters):
        x.fill_(float(r + 1))
        t = time.perf_counter()
        dist.all_reduce(x)
        x.div_(n)              # average, like push_pull(average=True)
        times.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    if abs(float(x[0]) - (n + 1) / 2.0) > 1e-3:
        raise SystemExit(f"rank {r}: wrong all_reduce result {float(x[0])}")
    print("CLUSTER_RESULT " + json.dumps({"system": "gloo", "rank": r, "size": n,
                                          "bytes": int(x.numel() * 4), "times": times,
                                          "cpu_s": cpu,      # ring: sends and receives
                                          "moved_bytes": int(4 * (n - 1) / n * x.numel() * 4
                                                             * iters)}),
          flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

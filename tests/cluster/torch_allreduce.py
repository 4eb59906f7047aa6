"""torch_allreduce.py - PyTorch gloo all-reduce with env:// initialisation, run under ddp-launch.

Each rank r fills x[i] = r + i (i < N); after the all-reduce every element must equal
W*i + W*(W-1)/2 exactly (small integers in float64). Also checks that the torchrun-style variables
ddp-launch exported agree with what torch.distributed reports. Prints one line per rank,
"torch-allreduce rank R/W host H: ok" or "...: FAIL why", and exits 1 on failure.
"""
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

N = 1000


def main() -> int:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            print(f"torch-allreduce: FAIL {var} not set by the launcher", flush=True)
            return 1
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(N, dtype=torch.float64) + rank
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    want = torch.arange(N, dtype=torch.float64) * world + world * (world - 1) / 2
    errors = []
    if rank != int(os.environ["RANK"]) or world != int(os.environ["WORLD_SIZE"]):
        errors.append(f"env RANK/WORLD_SIZE {os.environ['RANK']}/{os.environ['WORLD_SIZE']}")
    bad = (x != want).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        errors.append(f"{bad.numel()} wrong elements, first x[{i}]={x[i].item()} want {want[i].item()}")
    host = socket.gethostname()
    verdict = "ok" if not errors else "FAIL " + "; ".join(errors)
    print(f"torch-allreduce rank {rank}/{world} host {host}: {verdict}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())

"""
How fast gloo moves a rehearsal's traffic on this machine: N processes on one GPU (or CPU tensors), each collective
of a 1.3b model's bf16 bytes in BUCKETS calls, timed on rank 0. For benchmarks/gpu_first_run.sh.
    torchrun --nproc_per_node 3 benchmarks/gloo_probe.py [cuda|cpu] [ELEMENTS] [BUCKETS]
"""
import os
import sys
import time

import torch
import torch.distributed as dist

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
elements = int(float(sys.argv[2])) if len(sys.argv) > 2 else 1_313_722_368
buckets = int(sys.argv[3]) if len(sys.argv) > 3 else 33
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if device == "cuda":
    torch.cuda.set_device(0)
chunk = elements // buckets // world * world
whole = torch.ones(chunk, dtype=torch.bfloat16, device=device)
part = torch.ones(chunk // world, dtype=torch.bfloat16, device=device)


def timed(name, fn):
    dist.barrier()
    t = time.perf_counter()
    for _ in range(buckets):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    s = time.perf_counter() - t
    if rank == 0:
        print(f"{device} world {world}: {name} of {chunk * buckets * 2 / 1e9:.2f} GB in {buckets} calls: {s:.2f} s "
              f"({chunk * buckets * 2 / 1e9 / s:.2f} GB/s of the whole)", flush=True)


timed("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(whole, part))
timed("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(part, whole))
timed("all_reduce", lambda: dist.all_reduce(whole))
timed("broadcast", lambda: dist.broadcast(whole, 0))
dist.destroy_process_group()

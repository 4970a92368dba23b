"""
Offload's host pass timed as a GPU's own rank times it after training (zero3bench/accounting/hostpass.py), over the
slice's elements and the threads: whether each part's time is linear in the elements, which the plan assumes when it
scales the slice a run timed (at most hostpass.SLICE) to a partition of billions; and how it goes with the threads,
where the plan gives each rank of a node its share of the cores at the rate per core. On a GPU host the copy into the
GPU's weights is timed too. First, the seconds that DeepSpeedCPUAdam's op takes to load (or JIT-build).
  python3 benchmarks/host_pass_rate.py [--log2-sizes 16 27] [--threads 1 2 4 ...] [--dtype bf16]
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench import machine  # noqa: E402

machine.keep_extensions_apart()  # the ops' folder that the runs build into and load from
machine.ask_the_cpu_once()
import torch  # noqa: E402

from zero3bench.accounting import hostpass  # noqa: E402
from model import DTYPES  # noqa: E402

PARTS = ("unscale_s", "adam_s", "to_gpu_s", "to_host_s")


def row(elements, threads, weights, device):
    torch.set_num_threads(threads)
    t = hostpass.timed_parts(elements, weights, device)
    per = {key: t[key] / elements * 1e9 if t[key] is not None else None for key in PARTS}  # ns per element
    both = per["unscale_s"] + per["adam_s"]
    offload = (both + per["to_gpu_s"]) * threads if per["to_gpu_s"] is not None else None
    infinity = (both + per["to_host_s"]) * threads
    cells = [f"{per[k]:8.3f}" if per[k] is not None else "       -" for k in PARTS]
    adam_rate = elements / t["adam_s"] / 1e9
    print(f"{elements:>11,} {threads:>3}  {'  '.join(cells)}  {adam_rate:7.3f}  "
          f"{offload if offload is not None else float('nan'):9.2f} {infinity:9.2f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--log2-sizes", type=int, nargs=2, default=[16, 27], help="from 2^A to 2^B elements")
    p.add_argument("--threads", type=int, nargs="+", default=[hostpass.host_cores()])
    p.add_argument("--sweep-at", type=int, default=25, help="the threads swept at 2^N elements (the runs' SLICE)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    args = p.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    started = time.perf_counter()
    unloaded = hostpass.load_cpu_adam()
    print(f"DeepSpeedCPUAdam's op loaded (JIT-built where it was not) in {time.perf_counter() - started:.1f} s"
          f"{'; ' + unloaded.why_not if unloaded else ''}")
    print(f"host: {hostpass.cpu_model()}, {hostpass.host_cores()} cores; torch {torch.__version__}; device {device}; "
          f"weights {args.dtype}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print("ns per element of each part (the median of hostpass.STEPS steps); CPU Adam in G elements/s; the host "
          "pass of 3_offload and 3_infinity in core-ns per element (x threads)")
    print(f"{'elements':>11} {'thr':>3}  {'unscale':>8}  {'adam':>8}  {'to GPU':>8}  {'to host':>8}  {'G el/s':>7}  "
          f"{'3_offload':>9} {'3_infinity':>9}")
    weights = DTYPES[args.dtype]
    for threads in args.threads:
        for log2 in range(args.log2_sizes[0], args.log2_sizes[1] + 1):
            row(1 << log2, threads, weights, device)
    for threads in sorted({1, 2, 4, 8, 16, 32, 64, hostpass.host_cores()} - set(args.threads)):
        if threads <= hostpass.host_cores():
            row(1 << args.sweep_at, threads, weights, device)


if __name__ == "__main__":
    main()

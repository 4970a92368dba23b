"""
Offload's step on the host, timed on its host by every GPU's own rank, so that a plan of offload needs no offload
run: the parts of DeepSpeed's stage-3 optimizer step that run on the CPU when it offloads the optimizer (stage3.py's
step(), per sub-group): the fp32 gradients unscaled (unscale_and_clip_grads, one mul_), DeepSpeed's own
DeepSpeedCPUAdam on the fp32 master weights, and their copy into the training weights: with 3_offload the GPU's (a
blocking copy_ that converts on the CPU, then copies), with 3_infinity's offload_param the host's pinned ones. Each
is timed on a slice of the rank's partition, on the threads the rank had, as the node's ranks share the cores.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from zero3bench import parts

# The slice's elements: the parts' time per element is about flat once the slice outgrows the caches, so that a
# partition of billions is timed on 2^25 elements (0.6 GB of host memory): at one thread on this project's 2 cores,
# 3.0 to 3.8 ns from 2^23 to 2^27, and 0.6 to 1.5 at 2^20 and fewer (benchmarks/logs/cpu/hostpass/rate-f86c18c.txt).
SLICE = 1 << 25
STEPS = 3  # timed after the first, whose CPU Adam makes its moments


def cpu_model() -> str | None:
    """The CPU's model, as /proc/cpuinfo names it, else as Python's platform does; None where neither says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def seconds(action: Callable[[], object], device: torch.device | None = None) -> float:
    start = time.perf_counter()
    action()
    if device is not None:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def timed_parts(elements: int, weights: torch.dtype, device: torch.device) -> dict[str, float | None]:
    """Each part's median seconds over STEPS steps on a slice of elements, its tensors as stage 3 holds them: on a
    GPU host the master weights and gradients pinned, as the project's offload configs pin them."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # JIT-built on its first use in an environment, then loaded
    on_gpu = device.type == "cuda"
    master = torch.nn.Parameter(torch.ones(elements, pin_memory=on_gpu))
    master.grad = torch.full((elements,), 1e-3, pin_memory=on_gpu)
    adam = DeepSpeedCPUAdam([master], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    host_copy = torch.empty(elements, dtype=weights, pin_memory=on_gpu)
    gpu_copy = torch.empty(elements, dtype=weights, device=device) if on_gpu else None
    adam.step()
    times: dict[str, list[float]] = {"unscale_s": [], "adam_s": [], "to_gpu_s": [], "to_host_s": []}
    for _ in range(STEPS):
        times["unscale_s"].append(seconds(lambda: master.grad.mul_(1.0)))
        times["adam_s"].append(seconds(adam.step))
        if gpu_copy is not None:
            times["to_gpu_s"].append(seconds(lambda: gpu_copy.copy_(master.detach()), device))
        times["to_host_s"].append(seconds(lambda: host_copy.copy_(master.detach())))
    return {key: statistics.median(values) if values else None for key, values in times.items()}


def host() -> dict[str, int | str | None]:
    """Where the step is timed: the threads, the cores and the CPU."""
    return {"threads": torch.get_num_threads(), "host_cores": host_cores(), "cpu": cpu_model()}


def why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]


def timed_here(device: torch.device, rehearsal: bool) -> bool:
    """Whether a rank times the host pass: a GPU's own does, since plan.py --from refuses a folder of CPU ranks and
    takes no speed from a rehearsal; there CPU Adam's JIT build (minutes on this project's 2 cores, 51 s on a
    16-core H100 host: h100/7-families) would make the first run slower for nothing."""
    return device.type == "cuda" and not rehearsal


def load_cpu_adam() -> parts.HostPass | None:
    """DeepSpeed's CPU Adam loaded before training, where a signal can still interrupt the run: JIT-built on its
    first use in an environment (minutes on 2 busy cores), then loaded in about 1.5 s there
    (benchmarks/logs/cpu/hostpass/cost-f86c18c.txt). None once loaded, else the host pass that says why it could
    not be (no compiler), which ends no run."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # DeepSpeed keeps the op it loads for the process
        DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))])
    except (RuntimeError, ImportError, OSError) as e:  # a host that cannot build it still trains
        return parts.HostPass.made(**host(), why_not=why(e))
    return None


def probe(device: torch.device, weights: torch.dtype, partition: int) -> parts.HostPass:
    """Offload's host step timed on min(partition, SLICE) elements of CPU Adam loaded already (load_cpu_adam)."""
    elements = max(1, min(partition, SLICE))
    where = {"elements": elements, **host(), "dtype": str(weights).removeprefix("torch.")}
    try:
        return parts.HostPass.made(**where, **timed_parts(elements, weights, device))
    except (RuntimeError, MemoryError, OSError) as e:  # out of host memory under a cap: the run's results stand
        return parts.HostPass.made(**where, why_not=why(e))


def partition_of(params_total: int | None, world: int | None) -> int:
    """The elements a rank's CPU Adam steps at stage 3: its 1/world share of the parameters."""
    return math.ceil((params_total or 0) / (world or 1))

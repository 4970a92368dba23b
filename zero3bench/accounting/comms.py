"""
The communication of one rank, measured per step: the bytes that it all-gathers, reduce-scatters and
all-reduces, counted where DeepSpeed and FSDP2 alike call torch.distributed, and on GPUs the time that NCCL's
kernels took, from the profiler. Sizes follow nccl-tests: an all-gather's size is its gathered output, a
reduce-scatter's its whole input, an all-reduce's its buffer.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed

from zero3bench import compat, parts
from zero3bench.accounting import traffic

# torch.distributed's collectives by the kind of collective they are, and the argument that holds their size;
# torch 2.14 renamed the two single-tensor ones, and FSDP2 calls the new names
SIZED_BY = {"all_gather_into_tensor": ("all_gather", "output_tensor"),
            "all_gather_single": ("all_gather", "output_tensor"),
            "_all_gather_base": ("all_gather", "output_tensor"),
            "all_gather": ("all_gather", "tensor_list"),
            "reduce_scatter_tensor": ("reduce_scatter", "input"),
            "reduce_scatter_single": ("reduce_scatter", "input"),
            "_reduce_scatter_base": ("reduce_scatter", "input"),
            "reduce_scatter": ("reduce_scatter", "input_list"),
            "all_reduce": ("all_reduce", "tensor"),
            "all_reduce_coalesced": ("all_reduce", "tensors")}
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
# NCCL's kernels are named for their collective: ncclDevKernel_AllGather_RING_LL, ...
KERNELS = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}


class Counter:
    """The collectives of each kind since the last take()."""

    def __init__(self) -> None:
        self.inside = threading.local()  # a collective that calls another is counted once
        self.counts: dict[str, parts.Collectives] = {}
        self.take()

    def add(self, kind: str, tensors: torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]) -> None:
        tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        c = self.counts[kind]
        self.counts[kind] = parts.Collectives(bytes=c.bytes + sum(t.numel() * t.element_size() for t in tensors),
                                              elems=c.elems + sum(t.numel() for t in tensors), calls=c.calls + 1)

    def take(self) -> dict[str, parts.Collectives]:
        """What was counted since the last take, and start again."""
        taken, self.counts = self.counts, {kind: parts.Collectives() for kind in COLLECTIVES}
        return taken


COUNTER = Counter()


def moves_data(group: torch.distributed.ProcessGroup | None) -> bool:
    """A collective in a group of one rank moves nothing: DeepSpeed still calls them at one rank, FSDP2 not."""
    return not torch.distributed.is_initialized() or torch.distributed.get_world_size(group) > 1


def counted(name: str, op: Callable[..., Any]) -> Callable[..., Any]:
    kind, argument = SIZED_BY[name]
    signature = inspect.signature(op)

    @functools.wraps(op)
    def collective(*args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(*args, **kwargs).arguments
        if getattr(COUNTER.inside, "depth", 0) == 0 and moves_data(arguments.get("group")):
            COUNTER.add(kind, arguments[argument])
        COUNTER.inside.depth = getattr(COUNTER.inside, "depth", 0) + 1
        try:
            return op(*args, **kwargs)
        finally:
            COUNTER.inside.depth -= 1
    collective.counted = True
    return collective


def count_collectives() -> None:
    """Count every collective from now on. Before the process group starts: DeepSpeed keeps its own
    references to two of these functions from then on."""
    for module in (torch.distributed, torch.distributed.distributed_c10d):
        for name in SIZED_BY:
            op = getattr(module, name, None)
            if op is not None and not getattr(op, "counted", False):
                setattr(module, name, counted(name, op))


def profiler(device: torch.device) -> torch.profiler.profile | None:
    """A profiler of the GPU's kernels, or None where there are no NCCL kernels to time."""
    if device.type != "cuda":
        return None
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA], **compat.profiler_options())


def kernel_seconds(prof: torch.profiler.profile) -> dict[str, float | None]:
    """Seconds that NCCL's kernels of each kind ran in a profiled step; None for a kind that none ran."""
    totals = dict.fromkeys(COLLECTIVES, 0.0)
    for event in prof.key_averages():
        for kind, word in KERNELS.items():
            if event.key.startswith("nccl") and word in event.key:
                totals[kind] += getattr(event, "self_device_time_total", 0) / 1e6
    return {kind: seconds or None for kind, seconds in totals.items()}


@contextlib.contextmanager
def step(device: torch.device, profiled: bool) -> Iterator[dict[str, Any]]:
    """Counts the collectives of one training step into the dict it yields, as the fields of its parts.Step: by
    kind as "comm", and where profiled on a GPU, NCCL's kernels' seconds as "comm_s"."""
    found: dict[str, Any] = {}
    prof = profiler(device) if profiled else None
    COUNTER.take()
    with prof or contextlib.nullcontext():
        yield found
    taken = COUNTER.take()
    found.update(comm=taken, comm_s=kernel_seconds(prof) if prof else None)


# The sizes at which the link is probed, as nccl-tests' `-b 1M -e 1G -f 2`: an all-gather's gathered bytes
LINK_SIZES = tuple(2**k for k in range(20, 31))
WARMUP, ITERS = 5, 20  # nccl-tests' defaults


def gather_seconds(device: torch.device, nbytes: int, world: int) -> float | None:
    """The seconds of one all-gather of nbytes (its gathered output, in bf16) with nothing else running, out
    of place, averaged over ITERS after WARMUP, as nccl-tests times it; None where it does not fit."""
    elems = nbytes // 2 // world * world
    gathered: torch.Tensor | None  # set to None in the end, freeing the probe's memory
    mine: torch.Tensor | None
    try:
        gathered = torch.empty(elems, dtype=torch.bfloat16, device=device)
        mine = gathered.chunk(world)[torch.distributed.get_rank()].clone()
        for _ in range(WARMUP):  # the first call also sets up NCCL's buffers for this size
            torch.distributed.all_gather_into_tensor(gathered, mine)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            torch.distributed.all_gather_into_tensor(gathered, mine)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / ITERS
    except compat.OutOfMemoryError:
        return None
    finally:
        gathered = mine = None


def link_curve(device: torch.device, shared_gpu: bool) -> dict[str, float] | None:
    """The link as a curve: the bus bandwidth of an all-gather alone at each of LINK_SIZES, as nccl-tests'
    all_gather_perf gives it, in bytes per second by message bytes (a string: JSON's keys are). None without
    NCCL between GPUs (shared_gpu: ranks rehearsed on one GPU, or under a memory cap); it stops at the first size
    that does not fit, and its memory is left out of the run's peak."""
    world = torch.distributed.get_world_size()
    if device.type != "cuda" or shared_gpu or world < 2:
        return None
    curve = {}
    for nbytes in LINK_SIZES:
        seconds = gather_seconds(device, nbytes, world)
        if seconds is None:
            break
        curve[str(nbytes)] = traffic.bus_bandwidth("all_gather", nbytes // 2 // world * world * 2, seconds, world)
    torch.cuda.reset_peak_memory_stats(device)
    return curve or None

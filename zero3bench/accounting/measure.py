"""
What one rank holds, measured on the tensors themselves: what ZeRO partitioned, read from DeepSpeed's own
attributes (or, under FSDP2, from the DTensor shards), and a census of the live tensors sorted into the kinds
of model state.
"""
from __future__ import annotations

import gc
import math
import resource
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from deepspeed import comm as dist
from deepspeed.runtime.zero.utils import is_zero_param
from torch._subclasses.fake_tensor import FakeTensor

from zero3bench import parts
from zero3bench.accounting import predict

try:  # FSDP2's: torch.distributed.tensor is public from torch 2.5, FSDPModule from 2.6
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # a torch without them runs no FSDP2: no module or tensor is one of these
    class Absent:
        pass
    FSDPModule = DTensor = Shard = Absent

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

    from zero3bench import fsdp2


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor that this rank holds: an FSDP2 DTensor's local shard, or the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_numel(p: torch.Tensor) -> int:
    """A partitioned parameter's numel() is 0; ds_numel is its full size. A DTensor's numel is its full size."""
    return p.ds_numel if is_zero_param(p) else p.numel()


def sharded(p: torch.Tensor) -> bool:
    """Partitioned by ZeRO, or a DTensor that FSDP2 sharded."""
    return is_zero_param(p) or (isinstance(p, DTensor) and any(isinstance(x, Shard) for x in p.placements))


def fsdp2_rows(p: DTensor) -> tuple[int, int]:
    """The rows of dim 0 that FSDP2 gives this rank of its mesh, as torch.chunk does: ceil(rows / G) each,
    the last ones fewer or none; and ceil(rows / G)."""
    per_rank = math.ceil(p.shape[0] / p.device_mesh.size())
    return max(0, min(per_rank, p.shape[0] - p.device_mesh.get_local_rank() * per_rank)), per_rank


def shard_ok(p: torch.Tensor, world: int) -> bool:
    """ZeRO-3's shard is ceil(numel / G) elements (padded); FSDP2's is this rank's chunk of dim 0."""
    if is_zero_param(p):
        return p.ds_tensor.numel() == math.ceil(p.ds_numel / world)
    return local(p).shape[0] == fsdp2_rows(p)[0] and local(p).shape[1:] == p.shape[1:]


def shard_report(model: torch.nn.Module, world: int) -> parts.Shards:
    """Count what ZeRO-3 or FSDP2 partitioned: a partitioned ZeRO parameter has ds_numel (its full size) and
    ds_tensor (this rank's shard, ceil(numel / G) elements); a persistent one (ds_persist) also stays whole
    on every rank. An FSDP2 parameter is a DTensor sharded on dim 0."""
    params = list(model.parameters())
    split = [p for p in params if sharded(p)]
    return parts.Shards(
        param_tensors=len(params),
        partitioned_tensors=len(split),
        persistent_tensors=sum(bool(getattr(p, "ds_persist", False)) for p in split),
        params_total=sum(map(full_numel, params)),
        local_param_elems=sum(p.ds_tensor.numel() if is_zero_param(p) else local(p).numel() for p in params),
        persistent_elems=sum(p.ds_numel for p in split if getattr(p, "ds_persist", False)),
        largest_param_elems=max(map(full_numel, params)),
        shard_check_ok=all(shard_ok(p, world) for p in split),
    )


def owned_values(p: torch.Tensor, rank: int) -> tuple[torch.Tensor, int]:
    """The elements of p that this rank owns, and the place of the first in the whole tensor: all of an
    unpartitioned tensor, or this rank's shard without its padding."""
    if isinstance(p, DTensor):
        first_row = p.device_mesh.get_local_rank() * fsdp2_rows(p)[1]
        return local(p).flatten(), first_row * (p.numel() // max(p.shape[0], 1))
    if not is_zero_param(p):
        return p.data.flatten(), 0
    shard = p.ds_tensor.numel()
    return p.ds_tensor.flatten()[: max(0, min(shard, p.ds_numel - rank * shard))], rank * shard


@torch.no_grad()  # FSDP2's local shards require grad: with autograd on, the sum kept 8 bytes a weight
def weights_checksum(model: torch.nn.Module, rank: int, device: torch.device, squared: bool = False) -> float:
    """A sum of every weight of the model (or of its square), each multiplied by a factor that depends on its
    tensor and its place in it, from the elements each rank owns. It matches stage 0's only if the shards of all
    ranks hold stage 0's weights, each in its place. Squared, its terms are all of one sign: rounding that moves
    weights either way cancels out in it, where a signed sum can lose most of its size and leave the rounding as
    large as the sum (bf16 at a rate of 1e-3: 0.41% between healthy runs, benchmarks/logs/cpu/hf-heldout)."""
    chunk = 1 << 24  # bounds the fp64 temporaries
    total = torch.zeros((), dtype=torch.float64, device=device)
    for t, p in enumerate(model.parameters(), 1):
        values, first = owned_values(p, rank)
        for i in range(0, values.numel(), chunk):
            part = values[i: i + chunk].double()
            place = torch.arange(first + i, first + i + part.numel(), dtype=torch.float64, device=part.device)
            total += t * ((part * part if squared else part) * (place % 997 + 1)).sum()
    if any(map(sharded, model.parameters())):
        dist.all_reduce(total)
    return total.item()


def storages(tensors: Iterable[object], device_type: str) -> dict[int, int]:
    """{storage address: bytes} for the distinct storages behind these tensors on a kind of device."""
    found = {}
    for t in tensors:
        # torch.compile leaves fake tensors behind, which hold no memory
        if torch.is_tensor(t) and t.device.type == device_type and not isinstance(t, FakeTensor):
            try:
                storage = t.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                pass  # other tensor subclasses without storage
    found.pop(0, None)  # empty storages
    return found


def partitioned_gradients(optimizer: object) -> list[torch.Tensor | None]:
    """The gradient partitions that ZeRO keeps off the parameters: stage 3 reduces into one flat buffer of
    this rank's partitions, stage 2 into grads_in_partition, and both list them in averaged_gradients."""
    found = [getattr(optimizer, name, None) for name in ("grad_partitions_flat_buffer", "grads_in_partition")]
    averaged = getattr(optimizer, "averaged_gradients", None) or {}
    for group in (averaged.values() if isinstance(averaged, dict) else averaged):
        found += group or []
    return found


def census(engine: DeepSpeedEngine | fsdp2.Engine, device_type: str) -> parts.Census:
    """Bytes of every live tensor on a kind of device, counted from the tensors themselves and sorted into
    the model states (parameters, gradients, fp32 master weights, optimizer moments) and the rest
    (communication buckets, buffers)."""
    params = list(engine.module.parameters())
    opt = engine.basic_optimizer
    owners: dict[str, Sequence[torch.Tensor | None]] = {
        "params": [t for p in params for t in (local(p.data), getattr(p, "ds_tensor", None))],
        "grads": [local(p.grad) for p in params if p.grad is not None] + partitioned_gradients(engine.optimizer),
        # the optimizer's own parameters; ZeRO-3 lends them to its param_groups only during step()
        "master": [local(p) for group in opt.param_groups for p in group["params"]] + list(map(local, opt.state)),
        # an optimizer may keep its step count as a number (DeepSpeedCPUAdam), which holds no storage
        "moments": [local(t) for state in opt.state.values() for t in state.values() if torch.is_tensor(t)],
    }
    gc.collect()
    with warnings.catch_warnings():  # looking at every object touches deprecated torch attributes
        warnings.simplefilter("ignore")
        live = storages([o for o in gc.get_objects() if torch.is_tensor(o)], device_type)
    claimed: dict[int, int] = {}
    found: dict[str, Any] = {}  # bytes by kind: the census's fields
    for kind, tensors in owners.items():
        mine = {k: v for k, v in storages(tensors, device_type).items() if k not in claimed}
        claimed.update(mine)
        found[kind] = sum(mine.values())
    return parts.Census(**found, other=sum(v for k, v in live.items() if k not in claimed))


def combined(after_backward: parts.Census, after_step: parts.Census) -> parts.Census:
    """Gradients and optimizer states never all exist at one moment of the first step: Adam creates its
    moments in the step, which frees the gradients. The census after backward gives the parameters,
    gradients and other tensors; the one after the step, the master weights and moments."""
    return replace(after_backward, master=after_step.master, moments=after_step.moments)


def gathered_tensors(model: torch.nn.Module) -> int:
    """Partitioned, not persistent, and yet whole on this rank right now; FSDP2 puts plain tensors in the
    place of its DTensors while it holds them whole."""
    if isinstance(model, FSDPModule):
        return sum(1 for p in model.parameters() if not isinstance(p, DTensor))
    return sum(1 for p in model.parameters() if is_zero_param(p) and not p.ds_persist and p.numel() > 0)


def model_states_now(engine: DeepSpeedEngine | fsdp2.Engine, device: torch.device,
                     offload: dict[str, str | None]) -> tuple[parts.Census, parts.Census | None]:
    """The census on the device, and in host memory too where a GPU rank offloads (else None)."""
    offloaded = device.type == "cuda" and predict.host_kinds(offload)
    return census(engine, device.type), census(engine, "cpu") if offloaded else None


def memory_snapshot(device: torch.device) -> parts.MemorySnapshot:
    """Peak memory since the last reset: allocated and reserved on a GPU, and the process's peak resident set
    size, which is the host memory that offload costs (on a CPU, the only memory, and the only key it records)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device.type != "cuda":
        return parts.MemorySnapshot.made(peak_mem_bytes=rss)
    return parts.MemorySnapshot(peak_mem_bytes=torch.cuda.max_memory_allocated(device),
                                allocated_bytes=torch.cuda.memory_allocated(device),
                                peak_reserved_bytes=torch.cuda.max_memory_reserved(device), host_peak_rss_bytes=rss,
                                device_total_bytes=torch.cuda.get_device_properties(device).total_memory)


def optimizer_name(engine: DeepSpeedEngine | fsdp2.Engine) -> str:
    opt = engine.basic_optimizer
    return f"{type(opt).__module__.split('.')[0]}.{type(opt).__name__}{' (fused)' if opt.defaults.get('fused') else ''}"

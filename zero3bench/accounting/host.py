"""
The host memory of a rank that offloads its optimizer at stage 3: the peak of its resident set, from what DeepSpeed
allocates there. Pure arithmetic, as predict.py.
"""
import math
from typing import Any

from zero3bench.accounting.moments import prefetch_reach, taken_by_prefetch
from zero3bench.accounting.predict import zero_setting
from zero3bench.accounting.predict import ADAM_BYTES, MASTER_BYTES
from zero3bench.accounting.shapes import ModelShape
from zero3bench.stages import shards_params

# Fitted on 1.3b offloaded on one H200 (benchmarks/logs/h200/29-live/1-live/timeline/offload_r1_rank0.csv), held
# out on 350m and 2.7b: the resident set once the engine was ready, less the host tensors below (the process:
# Python, torch, CUDA's libraries), and what the first step added besides Adam's states.
PROCESS_BYTES = 1.26e9
FIRST_STEP_BYTES = 0.67e9


def pinned(nbytes: float) -> float:
    """A pinned host block as torch's caching host allocator makes it: rounded up to a power of two."""
    return 2 ** math.ceil(math.log2(nbytes)) if nbytes > 0 else 0


def sub_groups(shard: float, zero: dict[str, Any]) -> list[float]:
    """The rank's partition in DeepSpeed's sub-groups of sub_group_size elements, each stepped on its own."""
    size = zero_setting(zero, "sub_group_size")
    return [size] * int(shard // size) + ([shard % size] if shard % size else [])


def staging_bytes(width: int, world: int, zero: dict[str, Any], shape: ModelShape, params: float) -> float:
    """Ranks rehearsed on one GPU talk over gloo, which copies each all-gather's input and output through pinned
    host blocks that torch's allocator keeps: one pair for each gather in flight at once, as many as the prefetch
    holds ahead of backward (moments.prefetch_reach), one prefetch each: the block's matrices it takes, or, where
    it takes more than a block, the prefetch bucket."""
    _, ahead = prefetch_reach(zero, shape, params)
    bucket = zero_setting(zero, "stage3_prefetch_bucket_size")
    gather = max(taken_by_prefetch(bucket, shape.block_tensors[0]), bucket)
    return math.ceil(ahead / gather) * (pinned(width * gather) + pinned(width * gather / world))


def offloaded_weights_bytes(width: int, world: int, zero: dict[str, Any], shape: ModelShape) -> float:
    """The 16-bit weights where offload_param keeps them in host memory: each param group's partition in one flat
    buffer (train_gpt.decay_groups' two), pinned whatever pin_memory says (stage3.py:
    _create_param_groups_fp16_flat_cpu_memory); and with pin_memory, every partitioned tensor's own partition, that
    zero.Init pinned as it built the model (partition_parameters.py: _partition_param), the output layer's first
    weight among them where model.py then ties it to the embedding. The flat buffers take their place
    (_move_to_flat_buffer), but torch's caching host allocator keeps the freed blocks, and no later pinned block is
    of their sizes. 1.3b on one H200, the engine ready: 7.454 GB above 3_offload's peak resident set with the same
    settings, 7.455 predicted (36-step-time's two folders and 38-step-time2's 8zcB)."""
    param = zero.get("offload_param") or {}
    if param.get("device") != "cpu":
        return 0
    threshold = zero_setting(zero, "stage3_param_persistence_threshold")
    flat = sum(pinned(width * sum(math.ceil(n / world) for n in group)) for group in shape.decay_groups)
    tied = [shape.embedding] if shape.tied else []  # the output layer's own weight, built before model.py ties it
    built = [n for group in shape.decay_groups for n in group if n > threshold] + tied
    own = sum(pinned(width * math.ceil(n / world)) for n in built) if param.get("pin_memory") else 0
    return flat + own


def host_peak_bytes(stage: int, width: int, world: int, shard: float, zero: dict[str, Any], shape: ModelShape,
                    params: float, rehearsed: bool) -> float | None:
    """The peak resident set of a stage-3 rank whose optimizer DeepSpeed offloads to the CPU (None otherwise, and
    where its parameters go to NVMe): the process; its 16-bit gradient partition, pinned (stage3.py:
    grad_partitions_flat_buffer); its fp32 weights; each sub-group's fp32 gradients, pinned
    (initialize_optimizer_states); Adam's moments; what the first step adds; the 16-bit weights where they are
    offloaded too (offloaded_weights_bytes). In a sub-group's step, the 16-bit copy of its updated weights made on
    the host before it goes to the GPU (torch's copy converts on the CPU side), where the weights are on the GPU;
    offloaded, the step writes them in place. Rehearsed ranks add gloo's staging (staging_bytes)."""
    offload, param = zero.get("offload_optimizer") or {}, zero.get("offload_param") or {}
    if not shards_params(stage) or offload.get("device") != "cpu" or param.get("device") == "nvme":
        return None
    pin = pinned if offload.get("pin_memory") else float
    groups = sub_groups(shard, zero)
    held = (PROCESS_BYTES + pin(width * shard) + MASTER_BYTES * shard + sum(pin(MASTER_BYTES * g) for g in groups)
            + ADAM_BYTES * shard + FIRST_STEP_BYTES + offloaded_weights_bytes(width, world, zero, shape))
    step_copy = 0 if param.get("device") == "cpu" else width * max(groups)
    return held + step_copy + (staging_bytes(width, world, zero, shape, params) if rehearsed else 0)

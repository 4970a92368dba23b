"""
DeepSpeed's settings as it reads them, and what its own code holds beyond the paper: the gradients that stages 1 and
2 keep whole, and the moments above what a rank holds (stage 3's reduction of a full bucket, the prefetch that runs
ahead of backward, and the rehearsal's re-gather after the step of stages 1 and 2). Pure arithmetic, as predict.py,
whose peak takes the most of the moments.
"""
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zero3bench.stages import shards_params, splits_one_buffer
if TYPE_CHECKING:  # shapes imports predict, which imports this module
    from zero3bench.accounting.shapes import GPTConfig

DEEPSPEED_DEFAULTS = {"sub_group_size": 1e9, "stage3_prefetch_bucket_size": 5e7, "reduce_bucket_size": 5e8,
                      "stage3_max_live_parameters": 1e9, "memory_efficient_linear": True}
# The blocks that stage 3 gathers ahead of backward at most, with checkpointing, by the share of a block that one
# prefetch gathers: (per block of the model, besides), the root's weights also. Read off DeepSpeed 0.19.8's own
# coordinator on 2 CPU ranks (benchmarks/prefetch_probe.py, benchmarks/logs/cpu/prefetch), on models shaped as
# 1.3b and 2.7b, with 12 to 48 blocks, roots of 1.7 to 4 blocks, and every bucket and cap scaled to their block.
# Keyed by twelfths of a block. Not modelled: stage3_max_reuse_distance above 0 (DeepSpeed's default 1e9; the
# project's configs set 0), not probed, and backward without checkpointing, which gathers ahead too.
AHEAD = {8: (1 / 4, 3), 12: (1 / 2, 4)}
# model.py's block as stage 3 partitions it, in the order it prefetches: qkv, its projection, fc and mlp.proj, of
# 3, 1, 4 and 4 twelfths of its elements (its LayerNorms and biases, which persist at 1.3b's 1e4 threshold; where
# some do not, as at 2.7b, the probe with a threshold of 0 stayed within 1.5%)
BLOCK_TWELFTHS = (3, 1, 4, 4)


def zero_setting(zero: dict[str, Any], key: str) -> Any:
    """A setting of a config's zero_optimization section, or DeepSpeed's own value where it sets none."""
    return zero.get(key, DEEPSPEED_DEFAULTS[key])


def reduction_copies(width: int, world: int, zero: dict[str, Any], params: int) -> float:
    """Stage 3's reduction of a full gradient bucket (stage3.py, __avg_scatter_grads): its flat copy of
    reduce_bucket_size elements (the model's, where fewer) and this rank's part."""
    return width * min(zero_setting(zero, "reduce_bucket_size"), params) * (1 + 1 / world)


def scatter_bytes(stage: int, engine: str, width: int, world: int, zero: dict[str, Any], params: int,
                  blocks: float, embedding: float) -> float:
    """Stage 3's reduction of its first full gradient bucket in backward (reduction_copies), after the output
    layer's backward: the blocks' activations not yet run then (blocks: all of them), and the tied embedding's
    whole gradient (embedding: its elements), which the output layer made and which is reduced only after the
    embedding's own."""
    if not (shards_params(stage) and engine == "deepspeed" and world > 1):
        return 0
    bucket = min(zero_setting(zero, "reduce_bucket_size"), params)
    return reduction_copies(width, world, zero, params) + blocks * (1 - bucket / params) + width * embedding


def prefetched_twelfths(prefetch: float, d_model: int) -> float:
    """The twelfths of a block that one prefetch gathers: DeepSpeed takes whole tensors, in order, while it has
    fewer than stage3_prefetch_bucket_size elements (partitioned_param_coordinator.py); more than a block, inf."""
    taken = 0
    for twelfths in BLOCK_TWELFTHS:
        if taken * d_model**2 >= prefetch:
            return taken
        taken += twelfths
    return taken if prefetch <= taken * d_model**2 else math.inf


def gathered_ahead(layers: int, block: float, root: float, params: float, live: float, twelfths: float) -> float:
    """The most elements that stage 3 holds gathered in backward with checkpointing; block: the elements of a
    block that it partitions; twelfths: of a block, that one prefetch gathers (prefetched_twelfths). Recomputation
    fetches each block twice (for its recomputed forward, then its backward) while backward frees it once, and
    each fetch prefetches: where a prefetch gathers more than half a block, the blocks ahead grow at each block,
    as far as stage3_max_live_parameters lets them (and the block that backward asks for besides), and no
    further than AHEAD says; where it gathers more than a block, up to the whole model. Where it gathers a third
    or less, the block, one prefetch and the root's weights."""
    if twelfths > 12:
        end = params
    elif twelfths in AHEAD:
        per_block, besides = AHEAD[twelfths]
        end = (per_block * layers + besides) * block + root
    else:
        end = (1 + twelfths / 12) * block + root
    return min(live + block, end, params)


def prefetch_reach(zero: dict[str, Any], shape: "GPTConfig", params: float) -> tuple[float, float]:
    """The twelfths of a block that one prefetch gathers, and the most elements gathered ahead of backward, at a
    config's bucket and cap (prefetched_twelfths, gathered_ahead)."""
    twelfths = prefetched_twelfths(zero_setting(zero, "stage3_prefetch_bucket_size"), shape.d_model)
    return twelfths, gathered_ahead(shape.layers, 12 * shape.d_model**2, shape.root_params, params,
                                    zero_setting(zero, "stage3_max_live_parameters"), twelfths)


def prefetch_bytes(stage: int, engine: str, width: int, world: int, zero: dict[str, Any], shape: "GPTConfig",
                   params: int, checkpoint: bool, tokens: int, last_block: float, activations: float) -> float:
    """Stage 3 on more than one rank, in backward with checkpointing, where the prefetch holds the most ahead
    (gathered_ahead): those weights, the tied embedding's whole gradient (made by the output layer's backward,
    reduced after the embedding's), every block's checkpointed input, a recomputed block's activations, and a
    bucket's reduction. The offload config's 1e9 cap on 2 rehearsed ranks: 15 gathered blocks in flight at once,
    3.68 GiB at the peak (benchmarks/logs/h200/29-live). Where a prefetch gathers more than a block, forward's end
    has gathered them already, so backward's start, with all its activations, may hold more (350m offloaded on 2
    ranks: 290M of its 353M partitioned elements gathered there, its peak, 29-live/4-trace350m)."""
    if not (shards_params(stage) and engine == "deepspeed" and world > 1 and checkpoint):
        return 0
    twelfths, ahead = prefetch_reach(zero, shape, params)
    inputs = shape.layers * width * tokens * shape.d_model
    deep = (width * (ahead + shape.padded_vocab * shape.d_model) + inputs + last_block
            + reduction_copies(width, world, zero, params))
    return max(deep, width * ahead + activations if twelfths > 12 else 0)


def regathered_bytes(stage: int, engine: str, width: int, params: int, world: int, rehearsed: bool) -> int:
    """Stages 1 and 2 all-gather the updated 16-bit weights at the step's end (utils.all_gather_dp_groups'
    all_gather_into_tensor); over gloo, as ranks rehearsed on one GPU use, that makes a copy of the whole output on
    the device, where NCCL gathers in place: 8 rehearsed ranks at stage 2 peaked there, 2.446 GiB over what they
    held, against 2 x 1.314B bytes (28-suite-matrix/4-trace)."""
    return width * params if rehearsed and world > 1 and engine == "deepspeed" and splits_one_buffer(stage) else 0


def sub_group_elems(zero: dict[str, Any], largest: int, world: int) -> float:
    """The most elements of one stage-3 sub-group: a sub-group closes at the parameter that reaches
    sub_group_size, so it may exceed it by one partition."""
    return zero_setting(zero, "sub_group_size") + math.ceil(largest / world)


# DeepSpeed's stages 1 and 2 pad each flat group to a multiple of this many elements per rank (stage_1_and_2.py:
# nccl_start_alignment_factor, 4-byte alignment of 16-bit elements).
ALIGNMENT = 2


def in_partition(group: Sequence[int], world: int, rank: int) -> list[bool]:
    """For each tensor of a flat group, in order, whether it overlaps this rank's 1/G of the group, padded to
    ALIGNMENT elements a rank."""
    part = math.ceil(sum(group) / (ALIGNMENT * world)) * ALIGNMENT
    return [first < (rank + 1) * part and first + n > rank * part
            for n, first in zip(group, itertools.accumulate(group, initial=0))]


def whole_tensor_grad_elems(groups: Sequence[Sequence[int]], world: int, rank: int) -> int:
    """The gradient elements that DeepSpeed's stages 1 and 2 hold on a rank after backward. Both reduce the gradients
    during backward and keep, whole, those of the tensors that overlap this rank's 1/G of each flat group
    (stage_1_and_2.py, independent_gradient_partition_epilogue: get_flat_partition's list of them); stage 1 keeps
    no more, where the paper keeps every gradient. groups: each param group's tensor elements, in order."""
    held = 0
    for group in groups:
        total, part = sum(group), math.ceil(sum(group) / (ALIGNMENT * world)) * ALIGNMENT
        held += sum(n for n, mine in zip(group, in_partition(group, world, rank)) if mine)
        held += max(0, (rank + 1) * part - max(total, rank * part))  # the group's padding, in the last partitions
    return held


def grad_layout(stage: int, engine: str, params: int, shape: "GPTConfig | None", rank: int | None,
                offload: Mapping[str, str | bool | None]) -> Sequence[Sequence[int]] | None:
    """Each param group's tensor elements, in order (the shape's decay groups), where DeepSpeed's stages 1 and 2 lay
    them out in flat groups on the GPU and the layout can be known: a rank, and a shape whose tensors are the model's
    params; None elsewhere."""
    flat = engine == "deepspeed" and splits_one_buffer(stage) and not offload["optimizer"]
    known = shape is not None and rank is not None and sum(map(sum, shape.decay_groups)) == params
    return shape.decay_groups if flat and known and shape else None


def kept_grad_elems(stage: int, engine: str, world: int, params: int, shape: "GPTConfig | None", rank: int | None,
                    offload: Mapping[str, str | bool | None]) -> int | None:
    """The gradient elements that DeepSpeed's stages 1 and 2 keep on a rank after backward (whole_tensor_grad_elems)
    where grad_layout knows them; None where the paper's hold."""
    groups = grad_layout(stage, engine, params, shape, rank, offload)
    return whole_tensor_grad_elems(groups, world, rank) if groups and rank is not None else None


def telling_ranks(stage: int, engine: str, world: int, params: int, shape: "GPTConfig | None",
                  offload: Mapping[str, str | bool | None]) -> list[int]:
    """The ranks among which the one that holds the most is, where grad_layout knows the flat groups: those whose
    partition holds a tensor's first or last element, and the last; a rank inside one tensor keeps its gradients
    and moved those before it, no more than the rank where the tensor starts. Elsewhere the ranks hold alike, and
    rank 0 stands for them all (2**20 ranks took 4 minutes, one at a time)."""
    groups = grad_layout(stage, engine, params, shape, 0, offload)
    ranks = {0, world - 1}
    for group in groups or []:
        part = math.ceil(sum(group) / (ALIGNMENT * world)) * ALIGNMENT
        for n, first in zip(group, itertools.accumulate(group, initial=0)):
            ranks |= {first // part, (first + n - 1) // part}
    return sorted(ranks) if groups else [0]


def moved_grad_elems(groups: Sequence[Sequence[int]], world: int, rank: int, bucket: float) -> int:
    """The gradient elements that stage 1's reduction after backward has moved into its bucket, freeing their own,
    before it reaches the first tensor of this rank's partition: every tensor before it, in the groups' order, but
    those larger than the bucket, which it reduces in place (stage_1_and_2.py, reduce_independent_p_g_buckets_and_
    remove_grads: extra_large_param_to_reduce)."""
    moved = 0
    for group in groups:
        for n, mine in zip(group, in_partition(group, world, rank)):
            if mine:
                return moved
            moved += n if n <= bucket else 0
    return moved


def stage1_reduction_elems(groups: Sequence[Sequence[int]], world: int, rank: int, zero: dict[str, Any]) -> int:
    """Stage 1's reduction after backward (stage_1_and_2.py, reduce_gradients without overlap_comm) above every
    gradient that backward made and its bucket, in elements: the most of two moments. First, a tensor larger than
    the bucket (the embedding) is reduced on its own, through two copies of it (allreduce_bucket's flat copy and
    one more); then the rank's first tensor allocates the partition's contiguous gradients (copy_grads_in_partition:
    whole_tensor_grad_elems), once the tensors before it have moved into the bucket (moved_grad_elems). Read off
    the 1.3b model's stage 1 on 4 and 8 rehearsed ranks (28-suite-matrix), where rank 0 peaked 0.25 GiB above
    ranks 1 to 3; it held to 0.2% on 350m at 2 (fp32), 3 and 8 ranks and 2.7b at 4 (benchmarks/logs/h200/32-s12)."""
    bucket = zero_setting(zero, "reduce_bucket_size")
    largest = max(map(max, groups))
    alone = 2 * largest if largest > bucket else 0
    return max(alone, whole_tensor_grad_elems(groups, world, rank) - moved_grad_elems(groups, world, rank, bucket))

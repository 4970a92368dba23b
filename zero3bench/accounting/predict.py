"""What theory says one rank holds: the ZeRO paper's model states (Rajbhandari et al., 2020, Figure 1 and
section 5), DeepSpeed's own estimator, and the activations (Korthikanti et al., 2022). Pure arithmetic on
counts, with no torch and no deepspeed, so that it is tested against the paper's own figures."""
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from zero3bench.accounting.shapes import ModelShape
from zero3bench.stages import PARTITIONS, shards_nothing, shards_params, splits_one_buffer

# The kinds of model state, and the kinds of state a stage partitions them as.
KINDS = ("params", "grads", "master", "moments")
PARTITIONED_AS = {"params": "params", "grads": "grads", "master": "optimizer", "moments": "optimizer"}
WIDTH = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAM_BYTES = 8  # fp32 momentum and variance per element
MASTER_BYTES = 4  # an fp32 copy of the weights per element


# DeepSpeed's settings as it reads them: its own value where a config's zero_optimization section sets none
DEEPSPEED_DEFAULTS = {"sub_group_size": 1e9, "stage3_prefetch_bucket_size": 5e7, "reduce_bucket_size": 5e8,
                      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                      "stage3_param_persistence_threshold": 1e5, "memory_efficient_linear": True}

def zero_setting(zero: dict[str, Any], key: str) -> Any:
    """A setting of a config's zero_optimization section, or DeepSpeed's own value where it sets none."""
    return zero.get(key, DEEPSPEED_DEFAULTS[key])


def partitioned(stage: int, kind: str) -> bool:
    return PARTITIONED_AS[kind] in PARTITIONS[stage]


def model_states(stage: int, dtype: str, full: float, shard: float, persistent: int = 0,
                 engine: str = "deepspeed", grads: float | None = None) -> dict[str, float]:
    """The paper's model states of one rank by kind, for mixed-precision Adam: 16-bit weights and gradients (2 + 2 bytes
    per parameter) and K = 12 for fp32 master weights, momentum and variance, each whole or partitioned as PARTITIONS
    says. full: the model's parameters; shard: this rank's partition; persistent: elements that stage 3 keeps whole
    besides. In fp32, stage 0 steps the weights themselves, but ZeRO's optimizers keep an fp32 copy anyway (at stage 3,
    stage3.py compares a tensor's device with a string, so it never reuses the weights): 4 more bytes per partition
    element. FSDP2 (engine "fsdp2") keeps the fp32 weights themselves and fp32 gradients, sharded, and makes the 16-bit
    weights only for compute: the same 16 bytes per element, as 4 + 4 + 0 + 8. grads: the gradient elements held
    where they are not what the paper says (DeepSpeed's stages 1 and 2: predict.whole_tensor_grad_elems)."""
    width = WIDTH[dtype]
    per_element = {"params": width, "grads": width, "moments": ADAM_BYTES,
                   "master": MASTER_BYTES if width < 4 or not shards_nothing(stage) else 0}
    if engine == "fsdp2":
        per_element.update(params=MASTER_BYTES, grads=MASTER_BYTES, master=0)
    held = {kind: shard if partitioned(stage, kind) else full for kind in KINDS}
    held["params"] += persistent if shards_params(stage) else 0
    held["grads"] = held["grads"] if grads is None else grads
    return {kind: per_element[kind] * held[kind] for kind in KINDS}


def persistent_besides(persistent: int, world: int, offload: Mapping[str, str | bool | None]) -> int:
    """The elements that stage 3 keeps whole besides its shards: its persistent tensors', gathered once and kept; none
    on one rank whose partitions stay on the device, where that gather points each tensor at its partition
    (partition_parameters.py, _no_gather_coalesced: param.data = ds_tensor.data.to(the device), no copy). A tiny
    Llama of width 64 on one rank, every block's matrix persistent, held 100% of its weights where the promise had
    been 169.3%."""
    return 0 if world == 1 and not offload.get("param") else persistent


def shard_elems(stage: int, total: float, local: float, world: int) -> float:
    """This rank's partition: its own shards at stage 3 (counted, with padding), 1/G of the one flat buffer
    that stages 1 and 2 split, every element at stage 0."""
    return local if shards_params(stage) else total / world if splits_one_buffer(stage) else total


def host_buffer_bytes(shard: float, offload: Mapping[str, str | bool | None]) -> float:
    """What the host holds besides the offloaded model states: the CPU optimizer's fp32 gradients, one per
    partition element, into which each rank copies its 16-bit ones (stage3.py: fp32_partitioned_groups_flat's
    grad; stage_1_and_2.py: single_partition_of_fp32_groups' grad). The census counts them as the host's other
    tensors: 5.25 GB at 1.3b on one H200, 4 bytes a parameter (benchmarks/logs/h200/5-stages-offload-cap)."""
    return MASTER_BYTES * shard if offload["optimizer"] else 0


def host_kinds(offload: Mapping[str, str | bool | None]) -> list[str]:
    """The kinds of model state in host memory: with the optimizer offloaded (ZeRO-Offload), the gradient partitions it
    steps on besides its fp32 weights and moments; with the parameters too (ZeRO-Infinity), the 16-bit weights."""
    return (["grads", "master", "moments"] if offload["optimizer"] else []) + (["params"] if offload["param"] else [])


def device_state_bytes(states: Mapping[str, float], on_host: list[str], width: int, persistent: int) -> float:
    """The model states on the device: every kind not in host memory, and with the weights offloaded, stage 3's
    persistent ones, which stay."""
    return sum(v for k, v in states.items() if k not in on_host) + (width * persistent if "params" in on_host else 0)


def deepspeed_estimate(stage: int, total: int, largest: int, ranks_per_node: int, nodes: int,
                       offload: Mapping[str, str | bool | None]) -> dict[str, int] | None:
    """DeepSpeed's estimate_zero3_model_states_mem_needs (stage 3) and estimate_zero2_model_states_mem_needs
    (stages 1 and 2), as arithmetic, with zero.Init and their 1.5x host buffer: bytes per GPU and per node.
    It counts 18 bytes per partition element (2 + 2 + 4 fp32 gradients + 4 + 8) and, at stage 3, 4 bytes per
    element of the largest layer; none for stage 0. Products in DeepSpeed's order, for its rounding, so its bytes."""
    gpus, buffer, node_share = ranks_per_node * nodes, 1.5, 1 / nodes
    if shards_nothing(stage):
        return None
    if not shards_params(stage):
        if offload["optimizer"]:
            return {"device": 2 * total, "host_per_node": int(total * max(4 * gpus, 16) * buffer)}
        return {"device": 2 * total + int(18 * total / gpus), "host_per_node": int(total * 4 * ranks_per_node * buffer)}
    layer = 4 * largest
    if offload["optimizer"] and offload["param"]:
        return {"device": layer, "host_per_node": int(total * 18 * node_share * buffer)}
    if offload["optimizer"]:
        return {"device": layer + int(2 * total / gpus), "host_per_node": int(total * 16 * node_share * buffer)}
    return {"device": layer + int(18 * total / gpus), "host_per_node": int(largest * 4 * ranks_per_node * buffer)}


DEEPSPEED_ADAM = "deepspeed.FusedAdam"  # measure.optimizer_name of DeepSpeed's own Adam (a config's optimizer section)


def step_transient_bytes(stage: int, dtype: str, shard: float, optimizer_offloaded: bool, engine: str = "deepspeed",
                         sub_group: float | None = None, deepspeed_adam: bool = False) -> float:
    """What the optimizer step makes on the device (nothing where the optimizer runs on the host): the fp32 gradients,
    from the 16-bit ones; stage 0 in fp32, and FSDP2, step on the gradients themselves. Stages 1 and 2
    (stage_1_and_2.py, step) first flatten the partition's gradients into one 16-bit tensor, then cast it to fp32, and
    free the flat copy only after the cast: both at once, 2 + 4 bytes per partition element (in fp32 the cast is the
    flat copy itself: 4). Stage 3 makes its fp32 gradients one sub-group of at most sub_group elements at a time.
    Stage 0 in fp16 with DeepSpeed's own Adam (a config's optimizer section) steps through FP16_Optimizer
    (fused_optimizer.py, step), which casts each gradient to fp32 and then flattens the casts: 8 bytes an element
    at once (the original design's config, 2 ranks: 29.43 GiB against 29.44 predicted; 28-suite-matrix)."""
    if optimizer_offloaded or engine == "fsdp2" or (shards_nothing(stage) and WIDTH[dtype] == 4):
        return 0
    if shards_nothing(stage) and dtype == "fp16" and deepspeed_adam:
        return 2 * MASTER_BYTES * shard
    if splits_one_buffer(stage):
        return (WIDTH[dtype] + (MASTER_BYTES if WIDTH[dtype] < 4 else 0)) * shard
    return MASTER_BYTES * min(shard, sub_group or shard)


def overflow_check_bytes(stage: int, engine: str, dtype: str, shard: float) -> float:
    """Stage 3's fp16 overflow check (stage3.py, has_overflow): isinf of the gradient partition, as abs(x) == inf,
    a 16-bit copy and a mask at once (26-off-default, 2 ranks: 1.968 GB over what was held, against 3 x 656.9M)."""
    return (WIDTH[dtype] + 1) * shard if dtype == "fp16" and shards_params(stage) and engine == "deepspeed" else 0


# fp64, in which DeepSpeed takes gradient norms where the device has it (zero/utils.py, get_norm_dtype)
NORM_BYTES = 8


def grad_norm_bytes(stage: int, engine: str, largest: int, world: int, offloaded: bool) -> int:
    """Stage 3's gradient norm before the step (stage3.py, get_grad_norm_direct): each tensor's gradient partition
    cast to fp64, one at a time, so NORM_BYTES an element of the largest tensor's partition. With the optimizer on
    the host the norms are taken on the way there instead (complete_grad_norm_calculation_for_cpu_offload). Llama
    3.2 1B's stage 3 on one H200 peaked there, 1.95 GiB over what it held, its embedding's 263M elements 1.96 GiB
    (39-hf: -2.5% without it; benchmarks/logs/cpu/backward-probe, llama_r1, finds the fp64 copy)."""
    if offloaded or not (shards_params(stage) and engine == "deepspeed"):
        return 0
    return NORM_BYTES * math.ceil(largest / world)


def offloaded_grad_bytes(stage: int, engine: str, width: int, largest: int, world: int, offloaded: bool) -> int:
    """Stage 3 with its optimizer on the host, at the end of backward: the tied embedding's gradient partition
    on its way there, 4 x width + 4 bytes an element (its gradient and the one added to it, reduce_scatter's
    flat copy, the copy back from the pinned host buffer and its fp32 cast: stage3.py, partition_grads). Fitted on
    one H200 (1.3b, one rank, 26-off-default/4-rest and 27-suite-matrix): 1.236 GB against 12 x 103.0M elements."""
    if not (offloaded and shards_params(stage) and engine == "deepspeed"):
        return 0
    return (4 * width + MASTER_BYTES) * math.ceil(largest / world)


def frees_grads(stage: int, engine: str) -> bool:
    """Whether the gradients are freed after each step and made anew in backward, rather than kept in a buffer:
    so at the H200 runs (benchmarks/logs/h200/24-peaks: memory allocated after a step) by FSDP2 (zero_grad sets
    them to None) and by DeepSpeed at stage 0, while stage 3 keeps its partition in one flat buffer. Stages 1
    and 2 free theirs in the step (stage_1_and_2.py: free_grad_in_param_list, then averaged_gradients = None,
    the last hold on the contiguous partition that backward made)."""
    return engine == "fsdp2" or not shards_params(stage)


# DeepSpeed's engine at stage 0 all-reduces the gradients after backward in buckets of this many elements,
# whatever the config says (engine.py: allreduce_gradients' MEMORY_OPT_ALLREDUCE_SIZE).
ALLREDUCE_ELEMS = 500_000_000


def grad_bucket_bytes(stage: int, engine: str, width: int, zero: dict[str, Any]) -> float:
    """Stages 1 and 2's reduction buckets (stage_1_and_2.py, setup_buckets): reduce_bucket_size elements in the
    training dtype, two with overlap_comm, from the first gradient to the end of the reduction; stage 2 makes
    them at its first gradient hook, during backward."""
    if engine != "deepspeed" or not splits_one_buffer(stage):
        return 0
    return (2 if zero.get("overlap_comm") else 1) * width * zero_setting(zero, "reduce_bucket_size")


def reduction_bytes(stage: int, engine: str, dtype: str, params: int, shard: float, zero: dict[str, Any],
                    largest_in_block: int = 0) -> float:
    """What DeepSpeed makes after backward to reduce the gradients, on top of them, before the step:
    - stage 0 (engine.py, allreduce_no_retain): a flat copy of a bucket of gradients, filled until it passes
      ALLREDUCE_ELEMS (the tensor that passes it adds at most a block's largest, largest_in_block), in the
      training dtype, which the engine communicates in (allreduce_bucket casts to communication_data_type): the
      bf16 optimizer's fp32 gradients are one flat buffer already (bf16_optimizer.py). Fitted on the 350m model
      at 2 rehearsed ranks, the one bf16 run whose peak this moment is (26-off-default: 6.675 GiB, where fp32
      widths predicted 7.34); fp32's 350m run there, whose moment it is too, holds at 4 bytes;
    - stages 1 and 2 (stage_1_and_2.py, copy_grads_in_partition): the contiguous copy of the partition's
      gradients, made while the gradients it copies still live, and the buckets (grad_bucket_bytes).
    Stage 3 keeps its bucket throughout (buffer_bytes); FSDP2 reduces in place."""
    if engine != "deepspeed" or shards_params(stage):
        return 0
    width = WIDTH[dtype]
    if shards_nothing(stage):
        return width * min(params, ALLREDUCE_ELEMS + largest_in_block)
    return width * shard + grad_bucket_bytes(stage, engine, width, zero)


def buffer_bytes(stage: int, engine: str, width: int, zero: dict[str, Any]) -> float:
    """Buffers that DeepSpeed's stage 3 keeps besides the model states: its gradient bucket of
    reduce_bucket_size elements in the training dtype (the census's "other": 100.0 MB at 5e7 in bf16, in
    every stage-3 run of 24-peaks). None counted elsewhere: the census finds 16 kB at stage 0 and FSDP2."""
    return width * zero_setting(zero, "reduce_bucket_size") if shards_params(stage) and engine == "deepspeed" else 0


def fetches_weights(stage: int, engine: str, world: int, offload: Mapping[str, str | bool | None]) -> bool:
    """Whether DeepSpeed's stage 3 makes each module's whole weights on the device to compute it: on more than one
    rank it all-gathers them; on one, where offload_param keeps the partitions in host memory, it copies each
    tensor to the device (partition_parameters.py: NoGatherHandle); else a parameter on one rank is its
    partition, computed where it lies (_no_gather_coalesced)."""
    return shards_params(stage) and engine == "deepspeed" and (world > 1 or bool(offload["param"]))


def gathered_bytes(stage: int, engine: str, width: int, fetches: bool, block: float, embedding: int, root: int,
                   prefetch: float, params: float = math.inf) -> float:
    """The 16-bit weights that stage 3 holds gathered at once, on top of its shards: DeepSpeed the module it computes (a
    whole block, as train_gpt.py makes each block a leaf, or the embedding) and the prefetch bucket ahead of it, no more
    than the model holds (params: a model smaller than the bucket gathers itself whole at most), where it fetches
    weights (fetches_weights); FSDP2, even on one rank, as it casts them from its fp32 shards, its root module
    (embeddings, final norm), kept from forward into backward, the block it computes and the next one, prefetched.
    None at stages 0 to 2, which keep the weights whole."""
    if not shards_params(stage):
        return 0
    if engine == "fsdp2":
        return width * (root + 2 * block)
    return width * min(max(block, embedding) + prefetch, params) if fetches else 0


def saved_weights_bytes(stage: int, engine: str, width: int, fetches: bool, layers: int, block: float, output: int,
                        checkpoint: bool, zero: dict[str, Any]) -> float:
    """The fetched 16-bit weights (fetches_weights) that autograd keeps for backward at stage 3, with torch's own
    linear layer (memory_efficient_linear false, as ds_config_stage3.json has it): each Linear saves its weight, and
    DeepSpeed's release cannot free a storage that autograd still holds, so that backward fetches a second copy of
    it: the output layer's (output: its elements), which no checkpoint covers, and without checkpointing every
    block's. With DeepSpeed's linear, which saves the parameter rather than its data, none. On 2 H200s
    (benchmarks/logs/h200x2/13-fsdp2/15-final5, today's config) stage 3 without checkpointing peaked 2.44 GiB above
    the rest of the prediction at micro batch 2 (2.47 at 16): 24 blocks and the output layer are 2.44 GiB in bf16.
    With checkpointing, the output layer's weight twice at the loss's backward made up what 1.3b's peak on 4 and 8
    rehearsed ranks (24-peaks) lacked, 1.6% and 2.6%, and Llama 3.2 1B's and Qwen2.5 1.5B's on 4 (39-hf), 5.5% and
    4.0%; the probe finds both copies (benchmarks/logs/cpu/backward-probe)."""
    keeps = (shards_params(stage) and engine == "deepspeed" and fetches
             and not zero_setting(zero, "memory_efficient_linear"))
    return width * (output + (0 if checkpoint else layers * block)) if keeps else 0


# Measured, not derived: what a CUDA rank holds once it has stepped besides its model states and buffers, the
# same at every stage, micro batch and rank count (cuBLAS's workspaces, which torch allocates through its caching
# allocator at the first matmul, and small tensors). In every run of benchmarks/logs/h200/24-peaks, memory
# allocated after the last step less the predicted states and buffers: 69.9 to 72.5 MB.
WORKSPACE_BYTES = 72 * 10**6


def reduced_grads_bytes(stage: int, dtype: str, freed: float, transient: float) -> float:
    """The gradients alive while they are reduced after backward: at stage 0 in bf16, the bf16 optimizer's fp32
    copies, into which its hooks moved the bf16 ones (bf16_optimizer.py, accumulate_hp_grads_and_remove_lp);
    else those that backward made."""
    return transient if shards_nothing(stage) and dtype == "bf16" else freed


def shares(states: Mapping[str, float], whole: Mapping[str, float]) -> dict[str, float]:
    """Each kind of model state, as partitioned (params, grads, optimizer), as a share of what one rank
    would hold alone."""
    groups: dict[str, tuple[float, float]] = {}
    for kind in KINDS:
        held, alone = groups.get(PARTITIONED_AS[kind], (0, 0))
        groups[PARTITIONED_AS[kind]] = (held + states[kind], alone + whole[kind])
    return {group: held / alone for group, (held, alone) in groups.items()}


def holds_as_promised(held: Mapping[str, float], promised: Mapping[str, float], stage: int, straddling: float,
                      tolerance: float) -> bool:
    """Each group that the stage partitions is held at its promised share, and no group above it, give or
    take tolerance; at stages 1 and 2 DeepSpeed also keeps whole the gradients of the (at most two)
    tensors that straddle this rank's partition boundaries: a share of `straddling`."""
    slack = {group: tolerance * promised[group] + (straddling if group == "grads" and splits_one_buffer(stage) else 0)
             for group in held}
    return all(held[g] <= promised[g] + slack[g] and (g not in PARTITIONS[stage] or held[g] >= promised[g] - slack[g])
               for g in held)


# DeepSpeed's own layout: a stage-3 sub-group, and the gradients that stages 1 and 2 keep whole on a rank

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


def grad_layout(stage: int, engine: str, params: int, shape: ModelShape | None, rank: int | None,
                offload: Mapping[str, str | bool | None]) -> Sequence[Sequence[int]] | None:
    """Each param group's tensor elements, in order (the shape's decay groups), where DeepSpeed's stages 1 and 2 lay
    them out in flat groups on the GPU and the layout can be known: a rank, and a shape whose tensors are the model's
    params; None elsewhere."""
    flat = engine == "deepspeed" and splits_one_buffer(stage) and not offload["optimizer"]
    known = shape is not None and rank is not None and sum(map(sum, shape.decay_groups)) == params
    return shape.decay_groups if flat and known and shape else None


def kept_grad_elems(stage: int, engine: str, world: int, params: int, shape: ModelShape | None, rank: int | None,
                    offload: Mapping[str, str | bool | None]) -> int | None:
    """The gradient elements that DeepSpeed's stages 1 and 2 keep on a rank after backward (whole_tensor_grad_elems)
    where grad_layout knows them; None where the paper's hold."""
    groups = grad_layout(stage, engine, params, shape, rank, offload)
    return whole_tensor_grad_elems(groups, world, rank) if groups and rank is not None else None


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


def stage1_reduction_bytes(stage: int, engine: str, width: int, world: int, params: int, shape: ModelShape | None,
                           rank: int | None, offload: Mapping[str, str | bool | None],
                           zero: dict[str, Any]) -> float | None:
    """Stage 1's reduction after backward on a rank whose flat groups grad_layout knows (stage1_reduction_elems), in
    bytes; None elsewhere, where the reduction is the paper's (predict.reduction_bytes)."""
    groups = grad_layout(stage, engine, params, shape, rank, offload)
    if not groups or rank is None or partitioned(stage, "grads"):
        return None
    return width * stage1_reduction_elems(groups, world, rank, zero)

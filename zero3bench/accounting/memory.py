"""
One rank's memory by term, and its peak: the one formula that a rank's record, train_gpt.py --check, the report's
expectation and plan.py use. Its inputs are typed: the run (options.Run), the model's shape, what the rank counted
of the model's parameters (Counts) and where it runs (Seat). Each term is predict.py's or moments.py's arithmetic,
or, for the activations that backward needs (below rank_memory), this module's: what a Hugging Face model was counted
to keep (zero3bench/saved.py: shapes.Saved), whatever its block, and for a block described by the shape's fields
alone (model.py's, and the Llama layer of records from before the count) the arithmetic of what it saves, checked
against saved_tensors_hooks on a CPU (tests/test_accounting.py). Pure arithmetic, as predict.py.
"""
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from zero3bench.accounting import moments, predict
from zero3bench.accounting.predict import WIDTH
from zero3bench.accounting.shapes import LOSS_CHUNK, Kept, ModelShape
from zero3bench.options import Run
from zero3bench.stages import shards_params, splits_one_buffer

NO_OFFLOAD = {"optimizer": None, "param": None}
# Where in a step each of MemoryTerms.moments falls, in the step's order: forward; the output layer's backward (the
# loss's, which comes first, and the first bucket that stage 3 reduces after it, while every block's activations are
# still held); the blocks' backward; backward's end (the first block's, which comes last, and the reduction after
# backward); the optimizer step
MOMENTS = {"states": "forward", "gathered": "forward", "activations": "forward",
           "backward's start": "the output layer's backward", "first bucket": "the output layer's backward",
           "prefetch": "the blocks' backward", "backward's end": "backward's end", "reduction": "backward's end",
           "offloaded gradient": "the optimizer step", "regathered": "the optimizer step",
           "optimizer step": "the optimizer step"}
PEAK_MOMENTS = list(MOMENTS)[3:]  # the moments of which the peak is the most: each holds more than forward's


@dataclass(frozen=True)
class Counts:
    """The model's parameter elements that the prediction reads: as a rank counted them (its census of the
    partitioned model), or as a shape says they are (of_shape)."""
    params: int  # the model's
    largest: int = 0  # its largest tensor's: a stage-3 sub-group's overrun, the estimator's largest layer
    block: float = 0  # one block's
    root: int = 0  # outside the blocks'
    shard: float | None = None  # this rank's partition, counted with padding; None: as the stage splits params
    persistent: int = 0  # elements that stage 3 keeps whole besides its shards

    @classmethod
    def of_shape(cls, shape: ModelShape) -> "Counts":
        return cls(shape.params, shape.embedding, shape.block_params, shape.root_params)


@dataclass(frozen=True)
class Seat:
    """Where a rank runs, and what steps it, as far as its memory tells them apart."""
    world: int
    rank: int | None = None  # with a shape, the rank whose kept gradients DeepSpeed's stages 1 and 2 lay out
    on_gpu: bool = True  # False where host and device are one memory (CPU runs), which have no workspace
    rehearsed: bool = False  # ranks sharing one GPU over gloo (train_gpt.init_distributed)
    deepspeed_adam: bool = False  # the config's optimizer section makes DeepSpeed's own Adam


@dataclass(frozen=True)
class MemoryTerms:
    """One rank's bytes by term (each named after the predict.py or moments.py function that gives it), and what
    follows from them: what it holds throughout, its peak and what the allocator reserves."""
    breakdown: dict[str, float]  # the model states by kind (predict.KINDS), on the device and the host together
    states: float  # the model states on the device
    host_states: float  # the model states in host memory (offload)
    host_buffers: float  # the CPU optimizer's fp32 gradients
    buffers: float  # stage 3's gradient bucket
    workspace: float  # cuBLAS's workspaces and small tensors (predict.WORKSPACE_BYTES)
    freed_grads: float  # the gradients freed between steps and made anew in backward
    gathered: float
    start_gathered: float  # those gathered through the loss's backward (moments.start_gathered_bytes)
    saved_weights: float
    activations: float | None  # None where what the model keeps was not counted at the run's settings: no peak then
    logits: float  # of the activations, the output layer's: its logits and the loss's (output_layer_bytes)
    last_block: float  # the first block's activations, whose backward comes last
    scatter: float
    prefetched: float
    regathered: float
    reduction: float
    backward_buckets: float
    reduced_grads: float
    partition_grads: float
    transient: float  # what the optimizer step makes
    overflow_check: float
    grad_norm: float
    offloaded_grad: float

    @property
    def held(self) -> float:
        """What the rank holds throughout: the model states and buffers, less the gradients it frees between
        steps, and the workspace."""
        return self.states - (self.breakdown["grads"] if self.freed_grads else 0) + self.buffers + self.workspace

    def moments(self) -> dict[str, float] | None:
        """The rank's bytes at each named moment of its step (MOMENTS says where each is), in the step's order: what
        it holds throughout, with the weights that forward gathers, with the blocks' activations as forward ends, and
        the moments of which the peak is the most (PEAK_MOMENTS):
        - backward's start: the weights gathered through it (moments.start_gathered_bytes), those that autograd keeps
          (saved_weights_bytes), the activations with the logits (activation_bytes) and stage 2's buckets
          (grad_bucket_bytes); no gradient is made yet;
        - stage 3's reduction of its first full bucket in backward, after the output layer's, with the weights
          gathered (scatter_bytes);
        - stage 3's backward with checkpointing where the prefetch holds the most ahead (prefetch_bytes);
        - backward's end: every gradient made (freed_grads, where they are freed between steps), the weights
          gathered, and the first block's activations, whose backward comes last;
        - the reduction after backward (reduction_bytes), with the gradients it reduces (reduced_grads_bytes);
        - the offloaded embedding's gradient; on rehearsed ranks, the all-gather of the updated weights at the step's
          end (regathered_bytes);
        - the optimizer step: the partition's gradients (stage 1 frees the rest first) and what the step makes
          (transient), or before it stage 3's fp16 overflow check (overflow_check) or its gradient norm's fp64
          copies (grad_norm).
        Between backward's start and end, backward frees a block's activations as it makes its gradients: the held
        bytes move linearly from one end to the other, so their most is at an end. None where the activations are
        not predicted."""
        if self.activations is None:
            return None
        above = {"states": 0, "gathered": self.gathered, "activations": self.activations - self.logits,
                 "backward's start": (self.start_gathered + self.saved_weights + self.activations
                                      + self.backward_buckets),
                 "first bucket": self.gathered + self.scatter, "prefetch": self.prefetched,
                 "backward's end": self.freed_grads + self.gathered + self.last_block,
                 "reduction": self.reduced_grads + self.reduction, "offloaded gradient": self.offloaded_grad,
                 "regathered": self.regathered,
                 "optimizer step": self.partition_grads + max(self.transient, self.overflow_check, self.grad_norm)}
        return {name: self.held + bytes_ for name, bytes_ in above.items()}

    @property
    def peak(self) -> float | None:
        """The most of the rank's moments (moments), on top of what it holds throughout; None where the activations
        are not predicted."""
        named = self.moments()
        return None if named is None else max(named[name] for name in PEAK_MOMENTS)

    @property
    def reserved(self) -> float | None:
        """The least that PyTorch's caching allocator reserves, as torchtitan reports memory (max_reserved): the
        peak, and the gradients that a rank frees after each step, whose cached blocks the next forward's larger
        activations cannot reuse. At 24-peaks FSDP2's reserved exceeded its allocated peak by 3.9 to 6.7 GB on one
        rank, its gradients being 5.3 GB, where stage 3, which keeps them, exceeded it by 0.3 to 1.4 GB.
        Fragmentation besides is not predicted."""
        return None if self.peak is None else self.peak + self.freed_grads

    def flat(self) -> dict[str, Any]:
        """The terms and the figures that follow from them, by name, as plan.py's rows hold them."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "held": self.held, "peak": self.peak}


def offload_of(run: Run) -> dict[str, Any]:
    """What the run offloads, by offload_devices' keys, with None where a record names nothing."""
    return {**NO_OFFLOAD, **(run.offload or {})}


def telling_ranks(stage: int, engine: str, world: int, params: int, shape: ModelShape | None,
                  offload: Mapping[str, str | bool | None]) -> list[int]:
    """The ranks among which the one that holds the most is, where grad_layout knows the flat groups: those whose
    partition holds a tensor's first or last element, and the last; a rank inside one tensor keeps its gradients
    and moved those before it, no more than the rank where the tensor starts. Elsewhere the ranks hold alike, and
    rank 0 stands for them all (2**20 ranks took 4 minutes, one at a time)."""
    groups = predict.grad_layout(stage, engine, params, shape, 0, offload)
    ranks = {0, world - 1}
    for group in groups or []:
        part = math.ceil(sum(group) / (predict.ALIGNMENT * world)) * predict.ALIGNMENT
        for n, first in zip(group, itertools.accumulate(group, initial=0)):
            ranks |= {first // part, (first + n - 1) // part}
    return sorted(ranks) if groups else [0]


def rank_memory(run: Run, shape: ModelShape | None, counts: Counts, zero: dict[str, Any], seat: Seat) -> MemoryTerms:
    """One rank's memory in bytes, by term: the activations, predict.py's terms, then the moments that DeepSpeed's own
    code adds (moments.py). Without a shape, no activations; zero: the config's zero_optimization section, as
    DeepSpeed read it."""
    stage, engine, dtype, world, params = run.stage, run.engine, run.dtype, seat.world, counts.params
    offload, checkpoint, tokens = offload_of(run), bool(run.checkpoint), (run.micro_batch or 0) * (run.seq or 0)
    (embedding, layers), act = (shape.embedding, shape.layers) if shape else (0, 0), activations(run, shape, seat)
    width, offloaded = predict.WIDTH[dtype], bool(offload["optimizer"])
    shard = counts.shard if counts.shard is not None else predict.shard_elems(stage, params, -(-params // world), world)
    fetches = predict.fetches_weights(stage, engine, world, offload if seat.on_gpu else NO_OFFLOAD)  # holds whole
    kept = predict.kept_grad_elems(stage, engine, world, params, shape, seat.rank, offload)
    stage1 = predict.stage1_reduction_bytes(stage, engine, width, world, params, shape, seat.rank, offload, zero)
    sub_group = predict.sub_group_elems(zero, counts.largest, world) if shards_params(stage) else None
    paper = predict.model_states(stage, dtype, params, shard, counts.persistent, engine)  # all of stage 1's grads
    states = predict.model_states(stage, dtype, params, shard, counts.persistent, engine, kept)
    on_host = predict.host_kinds(offload) if seat.on_gpu else []
    device = predict.device_state_bytes(states, on_host, width, counts.persistent)
    freed = paper["grads"] if predict.frees_grads(stage, engine) and "grads" not in on_host else 0
    transient = predict.step_transient_bytes(stage, dtype, shard, offloaded, engine, sub_group, seat.deepspeed_adam)
    buckets = predict.grad_bucket_bytes(stage, engine, width, zero)
    reduction = (0 if offloaded else stage1 + buckets if stage1 is not None else predict.reduction_bytes(
        stage, engine, dtype, params, shard, zero, shape.qkv_params if shape else 0))  # stage 0's, as fitted
    gathered = predict.gathered_bytes(stage, engine, width, fetches, counts.block, embedding, counts.root,
                                      predict.zero_setting(zero, "stage3_prefetch_bucket_size"), params)
    return MemoryTerms(
        breakdown=states, states=device, host_states=sum(states.values()) - device, gathered=gathered,
        host_buffers=predict.host_buffer_bytes(shard, offload) if seat.on_gpu else 0, freed_grads=freed,
        buffers=predict.buffer_bytes(stage, engine, width, zero),
        workspace=predict.WORKSPACE_BYTES if seat.on_gpu else 0,
        saved_weights=predict.saved_weights_bytes(stage, engine, width, fetches, layers, counts.block, embedding,
                                                  checkpoint, zero),
        activations=act["activations"], logits=act["logits"], last_block=act["last_block"], reduction=reduction,
        backward_buckets=buckets if predict.partitioned(stage, "grads") else 0,
        reduced_grads=predict.reduced_grads_bytes(stage, dtype, freed, transient),
        partition_grads=width * shard if freed and splits_one_buffer(stage) else freed, transient=transient,
        overflow_check=predict.overflow_check_bytes(stage, engine, dtype, shard),
        grad_norm=predict.grad_norm_bytes(stage, engine, counts.largest, world, offloaded),
        offloaded_grad=predict.offloaded_grad_bytes(stage, engine, width, counts.largest, world, offloaded),
        **moments.rank_moments(stage, engine, width, world, fetches, zero, shape, params, checkpoint, tokens, act,
                               gathered, seat.rehearsed))


def activations(run: Run, shape: ModelShape | None, seat: Seat) -> dict[str, float | None]:
    """The activations' most when backward starts, the last block's, and all the blocks' when their backward starts:
    what the model was counted to keep (counted_bytes), or a described block's arithmetic (below); none without a
    shape, and not predicted (None) where what the model keeps was not counted at the run's settings (missing)."""
    if shape is None:
        return {"activations": 0, "logits": 0, "last_block": 0, "blocks": 0}
    micro_batch, seq, checkpoint = run.micro_batch or 0, run.seq or 0, bool(run.checkpoint)
    if shape.saved is not None:
        kept = kept_at(shape, run.dtype, micro_batch, seq, seat.on_gpu)
        if kept is None:
            return {"activations": None, "logits": 0, "last_block": 0, "blocks": 0}
        return counted_bytes(kept, checkpoint, micro_batch * seq, shape.padded_vocab, LOSS_CHUNK)
    flash, tokens, width = uses_flash(seat.on_gpu, run.dtype), micro_batch * seq, predict.WIDTH[run.dtype]
    return {"activations": activation_bytes(shape, run.dtype, micro_batch, seq, checkpoint, flash, LOSS_CHUNK),
            "logits": output_layer_bytes(shape, width, tokens, LOSS_CHUNK),
            "last_block": block_activation_bytes(shape, width, tokens, seq, flash),
            "blocks": blocks_backward_bytes(shape, run.dtype, micro_batch, seq, checkpoint, flash)}


# The activations of a block that the shape's fields describe (model.py's), and of a model counted to keep them

# The values of the MLP's inner width per token that one block keeps: GELU's input and mlp.proj's input; or the gated
# MLP's gate and up outputs, SiLU's output and down's input (the product)
MLP_VALUES = {"plain": 2, "gated": 4}


def uses_flash(on_gpu: bool, dtype: str) -> bool:
    """Whether attention runs SDPA's flash kernels, which keep no scores for backward: on a GPU, in 16 bits
    (they take 16-bit inputs only)."""
    return on_gpu and WIDTH[dtype] == 2


def norm_bytes(shape: ModelShape, width: int) -> int:
    """What one norm saves per token: a LayerNorm its input and fp32 mean and rstd; transformers' RMSNorm its input
    cast to fp32, the fp32 rstd, and the normalised input cast back, which the weight multiplies."""
    d = shape.d_model
    return width * d + 2 * 4 if shape.norm_kind == "layernorm" else 4 * d + 4 + width * d


def block_activation_bytes(shape: ModelShape, width: int, tokens: int, seq: int, flash: bool) -> int:
    """What one block saves for backward: its two norms (norm_bytes), attention's input, q, k and v, attention's
    output (which the output projection takes as it is), the MLP's input and its inner values (MLP_VALUES), and flash
    attention's fp32 logsumexp per head. For model.py's block, 16 values of d_model a token and the LayerNorms' stats:
    Korthikanti et al.'s 34 per token and d_model, less the two dropout masks that this model lacks. Without a fused
    attention kernel SDPA's math path keeps its softmax too, one value per score."""
    d = shape.d_model
    values = 3 * d + 2 * shape.kv_width + d + MLP_VALUES[shape.mlp] * shape.inner
    per_token = 2 * norm_bytes(shape, width) + width * values + (4 * shape.heads if flash else 0)
    return tokens * per_token + (0 if flash else width * shape.heads * seq * tokens)


def positions_bytes(shape: ModelShape, width: int, tokens: int) -> int:
    """Rotary positions' cos and sin, made once per forward and saved by every block's attention: one head's width
    each per token."""
    return 2 * width * (shape.d_model // shape.heads) * tokens if shape.positions == "rope" else 0


def output_layer_bytes(shape: ModelShape, width: int, tokens: int, loss_chunk: int) -> int:
    """The most that backward holds for the layers above the blocks, on top of what the blocks keep: the final norm's
    input (an RMSNorm's, as norm_bytes says) and output (the output layer's input), and at the last chunk of the loss,
    the logits (kept for the loss, recomputed chunk by chunk), the other chunks' gradients, which the split's backward
    joins only once all are made, and the last chunk's fp32 log-softmax, its gradient and its input's (12 bytes a
    logit). Measured on an H200 within 1.6% at 350m and 1.3b, micro batch 1 to 16, bf16 and fp32
    (benchmarks/logs/h200/31-suite/probe, which tests/test_accounting.py reads)."""
    chunk, d, vocab = min(loss_chunk, tokens), shape.d_model, shape.padded_vocab
    final_norm = width * d if shape.norm_kind == "layernorm" else norm_bytes(shape, width)
    return (final_norm + width * d) * tokens + loss_bytes(width * tokens * vocab, width, chunk, vocab)


def loss_bytes(logits: int, logit_width: int, chunk: int, vocab: int) -> int:
    """The most that the loss's backward holds (model.mean_loss): the logits, which it keeps to recompute each chunk,
    the other chunks' gradients (as many bytes), which the split's backward joins only once all are made, and the last
    chunk's fp32 log-softmax, its gradient and its input's (12 bytes a logit, less the logits' own)."""
    return 2 * logits + (12 - logit_width) * chunk * vocab


def activation_bytes(shape: ModelShape, dtype: str, micro_batch: int, seq: int, checkpoint: bool, flash: bool,
                     loss_chunk: int) -> int:
    """The activations when backward starts, their most: every block's saved tensors, or with checkpointing each
    block's input only, and the output layer's backward (output_layer_bytes); with checkpointing, a block
    recomputed during backward instead where it holds more than the output layer (not at 1.3b)."""
    width, tokens = WIDTH[dtype], micro_batch * seq
    block = block_activation_bytes(shape, width, tokens, seq, flash)
    output = output_layer_bytes(shape, width, tokens, loss_chunk) + positions_bytes(shape, width, tokens)
    if checkpoint:
        return shape.layers * width * tokens * shape.d_model + max(output, block)
    return shape.layers * block + output


def blocks_backward_bytes(shape: ModelShape, dtype: str, micro_batch: int, seq: int, checkpoint: bool,
                          flash: bool) -> int:
    """The activations when the blocks' backward starts, the output layer's done: every block's saved tensors, or with
    checkpointing each block's input and the last block recomputed; the rotary positions once, which every block
    saves by reference."""
    width, tokens = WIDTH[dtype], micro_batch * seq
    block = block_activation_bytes(shape, width, tokens, seq, flash)
    saved = shape.layers * width * tokens * shape.d_model + block if checkpoint else shape.layers * block
    return saved + positions_bytes(shape, width, tokens)


def kept_at(shape: ModelShape, dtype: str, micro_batch: int, seq: int, on_gpu: bool) -> Kept | None:
    """What the shape's model was counted to keep at these settings; None where it was not counted at them."""
    for saved in shape.saved or ():
        if (saved.seq, saved.dtype, saved.on_gpu) == (seq, dtype, on_gpu):
            return saved.at(micro_batch)
    return None


def missing(shape: ModelShape | None, dtype: str, seq: int, on_gpu: bool) -> str:
    """What the activations lack at these settings, in words; "" where they are predicted."""
    if shape is None:
        return "the model's shape is not known (its record carries none)"
    if shape.saved is None or kept_at(shape, dtype, 1, seq, on_gpu):
        return ""
    if not shape.saved:
        return shape.not_counted
    where = ", ".join(f"seq {s.seq} in {s.dtype} on a {'GPU' if s.on_gpu else 'CPU'}" for s in shape.saved)
    return (f"what its layers keep for backward was counted at {where}, not at seq {seq} in {dtype} on a "
            f"{'GPU' if on_gpu else 'CPU'}")


def counted_bytes(kept: Kept, checkpoint: bool, tokens: int, vocab: int, loss_chunk: int) -> dict[str, int]:
    """activation_bytes, the last block's and blocks_backward_bytes from what a model was counted to keep: when
    backward starts, what the forward left (with checkpointing, the blocks' inputs and what the rest keeps) and the
    loss's backward (loss_bytes); with checkpointing, a block recomputed in backward instead, once the layers above
    the blocks have freed theirs, where it holds more."""
    loss = loss_bytes(kept.logits, kept.logits // (tokens * vocab), min(loss_chunk, tokens), vocab)
    logits = kept.head + loss  # the layers above the blocks and the loss's backward, as output_layer_bytes has them
    if checkpoint:
        return {"activations": kept.checkpointed + max(loss, kept.most_block - kept.head), "logits": logits,
                "last_block": kept.first_block, "blocks": kept.checkpointed - kept.head + kept.most_block}
    return {"activations": kept.total + loss, "logits": logits, "last_block": kept.first_block,
            "blocks": kept.total - kept.head}

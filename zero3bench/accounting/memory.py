"""
One rank's memory by term, and its peak: the one formula that a rank's record, train_gpt.py --check, the report's
expectation and plan.py use. Its inputs are typed: the run (options.Run), the model's shape, what the rank counted
of the model's parameters (Counts) and where it runs (Seat). Each term is predict.py's or moments.py's arithmetic.
"""
from dataclasses import dataclass, fields
from typing import Any

from zero3bench.accounting import activations as saved, moments, predict
from zero3bench.accounting.shapes import LOSS_CHUNK, ModelShape
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
    activations: float | None  # None where the model's block is not one that activations.py knows: no peak then
    logits: float  # of the activations, the output layer's: its logits and the loss's (activations.output_layer_bytes)
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


def rank_memory(run: Run, shape: ModelShape | None, counts: Counts, zero: dict[str, Any], seat: Seat) -> MemoryTerms:
    """One rank's memory in bytes, by term: predict.py's, then the moments that DeepSpeed's own code adds (moments.py).
    Without a shape, no activations; zero: the config's zero_optimization section, as DeepSpeed read it."""
    stage, engine, dtype, world, params = run.stage, run.engine, run.dtype, seat.world, counts.params
    width, offload, offloaded = predict.WIDTH[dtype], offload_of(run), bool(offload_of(run)["optimizer"])
    act, checkpoint = activations(run, shape, seat), bool(run.checkpoint)
    shard = counts.shard if counts.shard is not None else predict.shard_elems(stage, params, -(-params // world), world)
    tokens = (run.micro_batch or 0) * (run.seq or 0)
    fetches = predict.fetches_weights(stage, engine, world, offload if seat.on_gpu else NO_OFFLOAD)
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
    return MemoryTerms(
        breakdown=states, states=device, host_states=sum(states.values()) - device,
        host_buffers=predict.host_buffer_bytes(shard, offload) if seat.on_gpu else 0,
        buffers=predict.buffer_bytes(stage, engine, width, zero),
        workspace=predict.WORKSPACE_BYTES if seat.on_gpu else 0, freed_grads=freed,
        **fetched_weights(run, shape, counts, zero, world, fetches),
        activations=act["activations"], logits=act["logits"], last_block=act["last_block"], reduction=reduction,
        backward_buckets=buckets if predict.partitioned(stage, "grads") else 0,
        reduced_grads=predict.reduced_grads_bytes(stage, dtype, freed, transient),
        partition_grads=width * shard if freed and splits_one_buffer(stage) else freed, transient=transient,
        overflow_check=predict.overflow_check_bytes(stage, engine, dtype, shard),
        grad_norm=predict.grad_norm_bytes(stage, engine, counts.largest, world, offloaded),
        offloaded_grad=predict.offloaded_grad_bytes(stage, engine, width, counts.largest, world, offloaded),
        scatter=moments.scatter_bytes(stage, engine, width, world, zero, params, act["blocks"],
                                      moments.held_output_grad_elems(shape) if shape else 0),
        prefetched=moments.prefetch_bytes(stage, engine, width, world, fetches, zero, shape, params, checkpoint,
                                          tokens, act["last_block"], act["activations"] or 0) if shape else 0,
        regathered=moments.regathered_bytes(stage, engine, width, params, world, seat.rehearsed))


def fetched_weights(run: Run, shape: ModelShape | None, counts: Counts, zero: dict[str, Any], world: int,
                    fetches: bool) -> dict[str, float]:
    """The 16-bit weights that stage 3 holds whole beyond its shards, where it fetches them (fetches: on more than
    one rank, or on one whose partitions live in host memory) and FSDP2 casts them: gathered at once while a module
    computes (predict.gathered_bytes), gathered through the loss's backward (moments.start_gathered_bytes), and
    those that autograd keeps for backward (predict.saved_weights_bytes)."""
    stage, engine, width, checkpoint = run.stage, run.engine, predict.WIDTH[run.dtype], bool(run.checkpoint)
    embedding, layers = (shape.embedding, shape.layers) if shape else (0, 0)
    gathered = predict.gathered_bytes(stage, engine, width, fetches, counts.block, embedding, counts.root,
                                      predict.zero_setting(zero, "stage3_prefetch_bucket_size"), counts.params)
    return {"gathered": gathered,
            "start_gathered": moments.start_gathered_bytes(width, world, fetches, gathered, zero, shape, checkpoint,
                                                           counts.params),
            "saved_weights": predict.saved_weights_bytes(stage, engine, width, fetches, layers, counts.block,
                                                         embedding, checkpoint, zero)}


def activations(run: Run, shape: ModelShape | None, seat: Seat) -> dict[str, float | None]:
    """The activations' most when backward starts, the last block's, and all the blocks' when their backward starts
    (activations.py); none without a shape, and not predicted (None) for a block that activations.py does not know."""
    if shape is None or not shape.activations_known:
        return {"activations": None if shape else 0, "logits": 0, "last_block": 0, "blocks": 0}
    micro_batch, seq, checkpoint = run.micro_batch or 0, run.seq or 0, bool(run.checkpoint)
    flash = saved.uses_flash(seat.on_gpu, run.dtype)
    tokens, width = micro_batch * seq, predict.WIDTH[run.dtype]
    return {"activations": saved.activation_bytes(shape, run.dtype, micro_batch, seq, checkpoint, flash, LOSS_CHUNK),
            "logits": saved.output_layer_bytes(shape, width, tokens, LOSS_CHUNK),
            "last_block": saved.block_activation_bytes(shape, width, tokens, seq, flash),
            "blocks": saved.blocks_backward_bytes(shape, run.dtype, micro_batch, seq, checkpoint, flash)}

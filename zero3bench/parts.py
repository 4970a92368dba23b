"""
The parts of a rank's result, typed: where it ran (Environment), what it held by kind (Census), its memory at a moment
(MemorySnapshot), what it partitioned (Shards), what theory predicts of its memory (Predicted) and each training step
(Step), with its collectives of each kind (Collectives). Its RESULT line carries most as records of their own, and
some flat (result.FLAT). A log of an older version lacks some of their keys, and a CPU run records no driver and a
smaller memory snapshot; a part writes back the keys it was made with, in their order, so that its record reads back
as it was written.
"""
from dataclasses import dataclass, field, fields
from typing import Any, Self


@dataclass(frozen=True)
class Part:
    # its record's keys, where it was read from one or made by made(); one made by its fields writes them all
    recorded: tuple[str, ...] | None = field(default=None, repr=False, compare=False, kw_only=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """The part a record holds; keys it does not know (a newer version's) are passed over."""
        known = [key for key in d if key in {f.name for f in fields(cls)} - {"recorded"}]
        return cls(**{key: d[key] for key in known}, recorded=tuple(known))

    @classmethod
    def made(cls, **values: Any) -> Self:
        """A part made here that records the keys given alone, in their order; a key it lacks raises TypeError."""
        return cls(**values, recorded=tuple(values))

    def as_dict(self) -> dict[str, Any]:
        keys = [f.name for f in fields(self) if f.name != "recorded"] if self.recorded is None else self.recorded
        return {key: getattr(self, key) for key in keys}


@dataclass(frozen=True)
class Environment(Part):
    """What a rank ran on (machine.environment): its host, its software's versions, its device."""
    host: str | None = None
    python: str | None = None
    torch: str | None = None
    deepspeed: str | None = None
    cuda: str | None = None  # the CUDA that torch was built with
    gpus_on_host: int | None = None
    device: str | None = None  # the GPU's name, or without one the CPU's
    driver: str | None = None  # NVIDIA's, on a GPU; None where nvidia-smi did not say


@dataclass(frozen=True)
class Census(Part):
    """Bytes of the live tensors in one memory, the device's or the host's, each counted once, under the first kind
    that owns it (accounting.measure.census): the model states (predict.KINDS) and the rest."""
    params: int = 0  # the parameters: the rank's shards, and the tensors it holds whole
    grads: int = 0  # their gradients, on the parameters and in the buffers where ZeRO reduces its partitions
    master: int = 0  # the optimizer's fp32 weights, where they are not the parameters themselves
    moments: int = 0  # the optimizer's state: Adam's two moments
    other: int = 0  # every other tensor: communication buckets, buffers

    def kind(self, name: str) -> int:
        """The bytes of one kind of model state, by its name in predict.KINDS."""
        return getattr(self, name)

    @property
    def states(self) -> int:
        """The model states: every kind but the other tensors."""
        return self.params + self.grads + self.master + self.moments


@dataclass(frozen=True)
class MemorySnapshot(Part):
    """A rank's memory at a moment (accounting.measure.memory_snapshot), its peaks since the last reset; a CPU run
    records its peak resident set alone."""
    peak_mem_bytes: int | None = None  # the peak allocated by PyTorch on a GPU; on a CPU, the peak resident set
    allocated_bytes: int | None = None  # allocated by PyTorch now
    peak_reserved_bytes: int | None = None  # the peak reserved by PyTorch's allocator
    host_peak_rss_bytes: int | None = None  # the process's peak resident set: the host memory that offload costs
    device_total_bytes: int | None = None  # the GPU's size


SNAPSHOT_KEYS = {f.name for f in fields(MemorySnapshot)} - {"recorded"}  # a snapshot's keys, in a step's record


@dataclass(frozen=True)
class Built(Part):
    """How the rank built its model (train_gpt.build_model): by whose code, how stage 3 partitioned it as it was built,
    and its memory then. A Hugging Face model's record carries its shape, which no preset names."""
    by: str | None = None  # "model.py", or "transformers 5.24.0"
    architecture: str | None = None  # the model's class: GPT, LlamaForCausalLM
    partitioned: str | None = None  # how stage 3 partitioned it at construction, or None where nothing did
    attention: str | None = None  # the attention implementation
    peak_bytes: int | None = None  # the device's peak while it was built (a CPU's: the resident set's)
    shape: dict | None = None  # accounting.shapes.ModelShape's fields, for a model that is no preset


@dataclass(frozen=True)
class Shards(Part):
    """What ZeRO-3 or FSDP2 partitioned on one rank (accounting.measure.shard_report); None where the rank failed
    before it counted."""
    param_tensors: int | None = None  # the model's parameter tensors
    partitioned_tensors: int | None = None  # those split across the ranks
    persistent_tensors: int | None = None  # those of them that stage 3 also keeps whole (ds_persist)
    params_total: int | None = None  # the model's parameter elements
    local_param_elems: int | None = None  # this rank's: its shards, with padding, and the tensors it holds whole
    persistent_elems: int | None = None  # the persistent tensors' elements
    largest_param_elems: int | None = None  # the largest tensor's
    shard_check_ok: bool | None = None  # whether every shard has the size that ZeRO-3 or FSDP2 gives it


@dataclass(frozen=True)
class Predicted(Part):
    """What theory predicts of a rank's memory (accounting.memory.rank_memory, from what the rank counted), against
    which its measurement is judged. A log from before a term was recorded lacks it."""
    breakdown: dict[str, float] | None = None  # the model states by kind (predict.KINDS), on the device and the host
    states: float | None = None  # the model states on the device
    host_states: float | None = None  # the model states in host memory (offload)
    deepspeed: dict[str, float] | None = None  # DeepSpeed's own estimator: device and host_per_node; None off DeepSpeed
    activations: float | None = None  # the activations when backward starts
    transient: float | None = None  # what the optimizer step makes: its fp32 gradient copies
    peak: float | None = None  # the rank's peak: what it holds throughout and the most of its moments
    moments: dict[str, float] | None = None  # the rank's bytes at each named moment of its step (memory.MOMENTS)


@dataclass(frozen=True)
class HostPass(Part):
    """DeepSpeed's optimizer step on the host as stage 3 makes it when it offloads the optimizer, timed after training
    on a slice of this rank's partition (accounting.hostpass.probe): each part's seconds on the slice, the median of
    a few steps; what a plan of offload takes from a run that did not offload. None where it was not timed (why_not)."""
    elements: int | None = None  # the slice: the rank's share of the parameters, at most hostpass.SLICE
    threads: int | None = None  # the threads CPU Adam ran on: torch's, whose OpenMP DeepSpeed's op shares
    host_cores: int | None = None  # the cores the rank could run on, which the ranks of its node shared
    cpu: str | None = None  # the CPU's model
    dtype: str | None = None  # the training weights' dtype, into which the updated fp32 weights are copied
    unscale_s: float | None = None  # the fp32 gradients unscaled (stage 3's unscale_and_clip_grads: one mul_)
    adam_s: float | None = None  # DeepSpeedCPUAdam's step on the fp32 master weights and their gradients
    to_gpu_s: float | None = None  # their copy into the GPU's weights, as stage 3 makes it (3_offload); None on a CPU
    to_host_s: float | None = None  # their copy into the host's pinned weights (3_infinity's offload_param)
    why_not: str | None = None  # why the step was not timed: the run did not finish, CPU Adam could not be built


@dataclass(frozen=True)
class Collectives(Part):
    """The collectives of one kind in a step (all-gathers, say), as accounting.comms counts them: their size in
    nccl-tests' terms (an all-gather's gathered output, a reduce-scatter's whole input, an all-reduce's buffer)."""
    bytes: int = 0
    elems: int = 0
    calls: int = 0


@dataclass(frozen=True)
class Step(Part):
    """One training step (train_gpt.train): its loss before the update, and what it cost. Every log records its
    step, loss, time_s and its memory's peak_mem_bytes; a step made by hand may leave out what its reader does not
    ask."""
    step: int | None = None
    loss: float | None = None
    lr: float | None = None  # absent in the oldest logs
    applied: bool = True  # False where fp16's loss scaler found an overflow and skipped the update; absent: True
    loss_scale: float | None = None  # fp16's, after the step
    time_s: float | None = None
    memory: MemorySnapshot | None = None  # the snapshot after it, whose keys its record holds flat, where this stands
    comm: dict[str, Collectives] | None = None  # its collectives by kind (accounting.comms.COLLECTIVES)
    comm_s: dict[str, float | None] | None = None  # the NCCL kernels' seconds by kind, in the profiled step
    traced: bool = False  # whether --timeline traced it (its hooks slow it: no speed is timed on it); absent: False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        record: dict[str, Any] = {}
        for key, value in d.items():
            if key in SNAPSHOT_KEYS:
                record.setdefault("memory", MemorySnapshot.from_dict(d))
            elif key == "comm" and value:
                record[key] = {kind: Collectives.from_dict(c) for kind, c in value.items()}
            else:
                record[key] = value
        return super().from_dict(record)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for key, value in super().as_dict().items():
            if key == "memory":
                d.update(value.as_dict() if value else {})
            elif key == "comm" and value:
                d[key] = {kind: c.as_dict() for kind, c in value.items()}
            else:
                d[key] = value
        return d


@dataclass(frozen=True)
class Point:
    """A rank's memory at one hook of its traced step (zero3bench/timeline.py), as a Timeline holds it: a row of its
    fields, in their order."""
    phase: str  # "forward", "backward" or "optimizer"
    event: str  # "forward", "forward done", "backward" (its output's gradient made), "gathered", "released", ...
    module: str  # the module's name in the model ("model" for the whole), or "" for the engine's own calls
    block: int | None  # its number among the model's blocks, where it is one
    allocated: int  # bytes allocated now: PyTorch's on a GPU; on a CPU, malloc's (or the resident set: Timeline.memory)
    peak: int  # the most allocated since the step began; on a CPU, the most of the points' so far
    rss: int  # the process's resident set: the host memory that offload costs
    gathered: int  # bytes of partitioned weights held whole now (ZeRO-3's or FSDP2's), the persistent ones aside

    def row(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


@dataclass(frozen=True)
class Timeline(Part):
    """A rank's memory through its traced step (--timeline, zero3bench/timeline.py): a point at each hook."""
    step: int | None = None  # the step it traced: the last
    # what a point's allocated counts: "cuda", PyTorch's allocator's; on a CPU, "malloc", the bytes that malloc has
    # handed out, or "rss", the resident set, where the C library cannot say (timeline.host_allocated)
    memory: str | None = None
    rows: list[list[Any]] | None = None  # the points, each as Point.row
    left_out: int = 0  # points left out to keep the record small (timeline.MAX_POINTS)
    hooks_s: float | None = None  # the hooks' own seconds in the step: what tracing it cost
    still_gathered: list[str] | None = None  # the modules whose partitioned weights were whole as backward returned
    snapshot: str | None = None  # the allocator's snapshot (--timeline=snapshot) that the rank wrote

    @property
    def points(self) -> list[Point]:
        return [Point(*row) for row in self.rows or []]


# the fields of a rank's result that hold one part each, by the part's class
ONE: dict[str, type[Part]] = {"env": Environment, "memory_at_start": MemorySnapshot, "model_state_breakdown": Census,
                              "host_state_breakdown": Census, "built": Built, "host_pass": HostPass,
                              "memory_timeline": Timeline}


def of(d: dict[str, Any]) -> dict[str, Any]:
    """The typed parts of a RESULT line's record, by its keys, where it holds them."""
    return {**{name: part.from_dict(d[name]) if d.get(name) else None for name, part in ONE.items()},
            "steps": [Step.from_dict(s) for s in d.get("steps") or []]}

"""
One result per rank (RankResult), built as the rank starts and filled as it runs, feeds every output: the
human lines, the RESULT JSON line, and through that line (RankResult.from_dict) the report's tables, verdict
and summary.json. A new figure is one property of RankResult and one row of reporting/tables.py (docs/layout.md).
"""
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from zero3bench import options, parts
from zero3bench.accounting import shapes, timing, traffic
from zero3bench.accounting.shapes import ModelShape

# Smaller collectives per step (a loss, a gradient norm) time their launch, not the link: no bus bandwidth.
# Their kernels are also counted where the wrapper does not see them (DTensor's norm in FSDP2's clipping).
BUSBW_MIN_BYTES = 1 << 20
RUN_KEYS = options.RUN_KEYS
Figure = TypeVar("Figure", int, float)  # most() gives the kind of figure it is given


@dataclass
class RankResult:
    """One rank's result, built once as the rank starts (its options.Run first) and filled as it runs; a
    rank that fails keeps what it got. as_dict is its RESULT line; from_dict reads one back."""
    run: options.Run = field(default_factory=lambda: options.run_from({}))  # its line carries its fields first, flat
    # where it ran
    rank: int | None = None
    world_size: int | None = None
    # "deepspeed", "torchrun", "srun", "mpirun", "one process", "RANK set" (adopt_launcher_env)
    launcher: str | None = None
    node: str | None = None  # the node it ran on, by the launcher's name for it (machine.launcher_node)
    mem_kind: str | None = None  # "cuda": memory is the GPU allocator's; "cpu_rss": the process's resident set
    gpus: int | None = None
    ranks_per_node: int | None = None
    ranks_per_gpu: int | None = None
    rehearsal: bool | None = None
    link_bytes_per_s: float | None = None  # NVLink's, per GPU and direction, where the ranks communicate over it
    env: parts.Environment | None = None
    # how it ended
    oom: bool = False
    error: str | None = None
    interrupted_by: str | None = None  # the signal that ended the run (at the end of a step if training), or a peer's
    diverged: str | None = None  # why the loss ended the run: not finite, or past options.DIVERGED_FACTOR x the first
    timing: dict = field(default_factory=dict)  # epoch seconds: started, imported, engine_ready, trained, probed
    # the engine
    built: parts.Built | None = None  # how its model was built (train_gpt.build_model)
    optimizer: str | None = None
    ready_s: float | None = None
    deepcompile_active: bool | None = None  # whether DeepSpeed says DeepCompile compiled the run; None: cannot say
    memory_at_start: parts.MemorySnapshot | None = None  # the memory snapshot once the engine is ready
    zero_config: dict | None = None  # the zero_optimization section as DeepSpeed read it (compat.zero_config)
    # partitioning
    shards: parts.Shards = field(default_factory=parts.Shards)  # what it partitioned (accounting.measure.shard_report)
    weights_checksum: float | None = None
    trained_checksum: float | None = None  # the weights checksum after the same rows' steps (options.SAME_ROWS_STEPS)
    gathered_tensors: int | None = None
    held_fraction: dict | None = None
    promised_fraction: dict | None = None
    partition_check_ok: bool | None = None
    # memory, measured (accounting.measure.census, in the last step) and predicted
    model_state_breakdown: parts.Census | None = None  # on the device (GPU, or CPU without GPUs)
    host_state_breakdown: parts.Census | None = None  # in host memory, with offload on GPUs
    predicted: parts.Predicted = field(default_factory=parts.Predicted)  # what theory predicts of them and of the peak
    differences: list | None = None
    # the most of its memory snapshots' peaks, the GPU's size; a peak of 0 where the rank did not finish
    peaks: parts.MemorySnapshot = field(default_factory=lambda: parts.MemorySnapshot(peak_mem_bytes=0))
    steps: list[parts.Step] = field(default_factory=list)  # training, per step
    memory_timeline: parts.Timeline | None = None  # its memory through the last step, at each hook (--timeline)
    flops_per_token: float | None = None
    peak_tflops: float | None = None  # the device's dense 16-bit peak, where known
    # the link's curve after training: an all-gather's bus bandwidth by bytes (comms.link_curve); logs from before
    # the curve hold its one figure, at 256 MiB
    link_busbw: dict[str, float] | float | None = None
    # offload's step on the host (CPU Adam and the copies around it), timed on a slice after training; logs from before
    # it lack it
    host_pass: parts.HostPass | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RankResult":
        """A RESULT line's result; its figures are worked out again, and keys it does not know (a figure, or
        a field of an older or newer version) are passed over; the parts it carries flat (FLAT) are made again.
        Logs from before flops_per_token and peak_tflops were recorded stored only the figures made of them: those
        give them back."""
        own = {k: v for k, v in d.items() if k in FIELDS and k not in CARRIED}
        r = cls(options.run_from(d), **{**own, **parts.of(d)}, **{name: carried(d, name) for name in FLAT})
        tflops, tokens = d.get("tflops_per_gpu"), d.get("tokens_per_s")
        if r.flops_per_token is None and tflops and tokens and r.gpus:
            r.flops_per_token = tflops * 1e12 * r.gpus / tokens
        if r.peak_tflops is None and tflops and d.get("mfu"):
            r.peak_tflops = tflops / d["mfu"]
        return r

    # Figures derived from the fields above. A new one is a property here, which every RESULT line then
    # carries, and a row in zero3bench/reporting/tables.py's COMPARISON.
    @property
    def model_state_bytes(self) -> int | None:
        return self.model_state_breakdown.states if self.model_state_breakdown else None

    @property
    def host_state_bytes(self) -> int | None:
        return self.host_state_breakdown.states if self.host_state_breakdown else None

    @property
    def mem_after_init_bytes(self) -> int | None:
        return self.memory_at_start.allocated_bytes if self.memory_at_start else None

    @property
    def losses(self) -> list[float] | None:
        return [s.loss for s in self.steps] or None

    @property  # the loss before each applied update: a skipped step only repeats it
    def trained_losses(self) -> list[float] | None:
        return [s.loss for s in self.steps if s.applied] or None

    @property
    def applied_steps(self) -> int:
        return sum(s.applied for s in self.steps)

    @property
    def skipped_steps(self) -> int:  # as DeepSpeed's engine.skipped_steps counts them
        return len(self.steps) - self.applied_steps

    @property
    def first_loss(self) -> float | None:
        return self.steps[0].loss if self.steps else None

    @property
    def nonfinite_loss(self) -> bool:
        return not all(math.isfinite(s.loss) for s in self.steps)

    @property
    def timed_from(self) -> int:
        """The first step that counts for speed."""
        return options.first_timed_step(self.run.deepcompile, self.run.stage)

    @property
    def step_time_s(self) -> float | None:
        """The median over steps timed_from..N, but for a step run under the profiler; a run of one step is timed
        on that step. None for a DeepCompile run that stopped before it was timed: its steps are compiles. A step
        that --timeline traced is not timed: its hooks slow it."""
        unprofiled = [s for s in self.steps if not (s.comm_s or s.traced)]
        timed = [s.time_s for s in unprofiled if s.step >= self.timed_from]
        if not timed and self.timed_from == 2:
            timed = [s.time_s for s in unprofiled]
        return statistics.median(timed) if timed else None

    def counted_comm(self) -> dict[str, parts.Collectives] | None:
        """The last step's collectives as accounting.comms counted them; None with DeepCompile, whose own op
        calls NCCL from C++, where the count does not reach; None too where the rank failed before its first step."""
        return None if self.run.deepcompile or not self.steps else self.steps[-1].comm

    @property
    def comm_bytes(self) -> dict[str, int] | None:
        """Bytes per kind of collective in the last step (nccl-tests' sizes: accounting.comms)."""
        last = self.counted_comm()
        return {kind: c.bytes for kind, c in last.items()} if last else None

    @property
    def comm_volume(self) -> float | None:
        """The last step's communication in the ZeRO paper's units: 2 (x the parameters) for an all-reduce of
        the gradients, 3 for stage 3."""
        last = self.counted_comm()
        return traffic.volume(last, self.shards.params_total) if last and self.shards.params_total else None

    @property
    def paper_comm_volume(self) -> int:
        return traffic.comm_volume(self.run.stage, self.world_size)

    @property
    def busbw(self) -> dict[str, float | None] | None:
        """nccl-tests' bus bandwidth per kind of collective, in bytes per second, from the profiled step's
        NCCL kernels; None where nothing was timed."""
        seconds = self.steps[-1].comm_s if self.steps else None
        if not seconds or not self.comm_bytes:
            return None
        return {kind: traffic.bus_bandwidth(kind, self.comm_bytes[kind], t, self.world_size)
                if t and self.comm_bytes[kind] >= BUSBW_MIN_BYTES else None for kind, t in seconds.items()}

    def link_busbw_at(self, nbytes: int) -> float | None:
        """The link's bus bandwidth for messages of nbytes, read off its curve between the sizes probed (log-linear),
        at the nearest end beyond them; logs from before the curve hold one figure, at 256 MiB."""
        curve = self.link_busbw if isinstance(self.link_busbw, dict) else (
            {str(1 << 28): self.link_busbw} if self.link_busbw else None)
        return traffic.read_curve({int(k): v for k, v in curve.items()}, nbytes) if curve else None

    def tokens_per_step(self) -> int:
        return self.world_size * self.run.micro_batch * self.run.seq

    def tflops_at(self, seconds: float | None) -> float | None:
        """Each GPU's TFLOP/s in a step of this many seconds (FLOPs: predict.flops_per_token)."""
        if not (seconds and self.flops_per_token):
            return None
        return self.flops_per_token * self.tokens_per_step() / seconds / self.gpus / 1e12

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens_per_step() / self.step_time_s if self.step_time_s else None

    @property
    def tflops_per_gpu(self) -> float | None:
        return self.tflops_at(self.step_time_s)

    @property
    def mfu(self) -> float | None:
        return self.tflops_per_gpu / self.peak_tflops if self.tflops_per_gpu and self.peak_tflops else None

    def hfu_at(self, seconds: float | None) -> float | None:
        """The hardware's FLOPs over its peak in a step of this many seconds: the MFU with checkpointing's
        recomputed forward counted (timing.hfu_per_mfu); None without checkpointing, where it is the MFU."""
        tflops = self.tflops_at(seconds)
        if not (self.run.checkpoint and tflops and self.peak_tflops):
            return None
        return tflops / self.peak_tflops * timing.hfu_per_mfu(True)

    @property
    def hfu(self) -> float | None:
        return self.hfu_at(self.step_time_s)


FIGURES = [name for name, value in vars(RankResult).items() if isinstance(value, property)]
# The fields that hold a part which the RESULT line carries flat, as a step carries its snapshot: the line's key
# for each of the part's fields that it carries, in the line's order
FLAT: dict[str, dict[str, str]] = {
    "shards": {f.name: f.name for f in fields(parts.Shards) if f.name != "recorded"},
    "predicted": {"breakdown": "predicted_breakdown", "states": "predicted_model_state_bytes",
                  "host_states": "predicted_host_state_bytes", "deepspeed": "deepspeed_estimate",
                  "activations": "activation_estimate_bytes", "transient": "step_transient_bytes",
                  "peak": "predicted_peak_bytes", "moments": "predicted_moments"},
    "peaks": {key: key for key in ("peak_mem_bytes", "peak_reserved_bytes", "device_total_bytes",
                                   "host_peak_rss_bytes")},
}
FLAT_FIELDS = {f.name: f for f in fields(RankResult) if f.name in FLAT}
CARRIED = {key for keys in FLAT.values() for key in keys.values()}  # the keys of the parts carried flat
# the rank's own, as its RESULT line names them
FIELDS = ({f.name for f in fields(RankResult)} - {"run"} - FLAT.keys()) | CARRIED
# the keys a RESULT line carries, with the types a record's values must have
LINE_TYPES = {**{f.name: f.type for f in fields(options.Run)},
              **{f.name: f.type for f in fields(RankResult) if f.name in FIELDS},
              **{FLAT[name][f.name]: f.type for name, held in FLAT_FIELDS.items() for f in fields(held.type)
                 if f.name in FLAT[name]}}


def carried(d: dict[str, Any], name: str) -> parts.Part:
    """The part in the field name as a RESULT line carries it flat: the field's default but for the keys it holds."""
    return replace(FLAT_FIELDS[name].default_factory(), **{f: d[key] for f, key in FLAT[name].items() if key in d})


def flat(r: RankResult, name: str) -> dict[str, Any]:
    """The keys that r's RESULT line carries for its part in the field name, in their order."""
    return {key: getattr(getattr(r, name), f) for f, key in FLAT[name].items()}


def shape_of(r: RankResult) -> ModelShape | None:
    """The model's shape: its preset's, or the one its record carries (a Hugging Face model's); None for a model
    that is neither (a record from an older version)."""
    if r.built and r.built.shape:
        return shapes.from_record(r.built.shape)
    return shapes.PRESETS.get(r.run.model)


def most(values: Iterable[Figure | None]) -> Figure | None:
    """The largest of the figures that were measured, or None: per-rank figures are judged at the rank that
    holds the most."""
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


def line_value(r: RankResult, key: str) -> Any:
    """The field that r's RESULT line carries under key, its run's or its own: for settings named as data."""
    return getattr(r.run if key in RUN_KEYS else r, key)


def as_dict(r: RankResult) -> dict[str, Any]:
    """The result as its RESULT line carries it, flat: its run's fields, its own (the parts of FLAT flat among them)
    and its figures."""
    own = {**asdict(r), **{name: part.as_dict() if (part := getattr(r, name)) else None for name in parts.ONE},
           "steps": [s.as_dict() for s in r.steps]}
    line = own.pop("run")
    for name, value in own.items():
        line.update(flat(r, name) if name in FLAT else {name: value})
    return {**line, **{name: getattr(r, name) for name in FIGURES}}


def result_line(r: RankResult) -> str:
    return "RESULT " + json.dumps(as_dict(r))

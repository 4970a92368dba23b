"""
A plan of a cluster: per GPU, the memory and the step time of each setup (a ZeRO stage and the engine that runs it)
on each GPU count, from the theory in zero3bench/accounting alone, as typed rows. torch-free.
"""
import bisect
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zero3bench import stages
from zero3bench.accounting import host, predict, timing, traffic
from zero3bench.accounting.memory import Counts, MemoryTerms, Seat, rank_memory
from zero3bench.accounting.shapes import ModelShape
from zero3bench.options import run_from
from zero3bench.accounting.timing import hfu_per_mfu
from zero3bench.planning.inputs import Calibration
from zero3bench.planning.steptime import HostPass, WorldOne

DTYPE = "bf16"  # the plan is of 16-bit training, the precision the peak FLOP/s are for
WIDTH = predict.WIDTH[DTYPE]
MAX_GPUS = 2**20  # the search for the smallest G that fits stops here
# What each setup is: a ZeRO stage and the engine that runs it.
SETUPS = {**{str(stage): (stage, "deepspeed") for stage in stages.PARTITIONS}, "fsdp2": (stages.ZERO3, "fsdp2")}
MODES = ("overlapped", "serial")


@dataclass(frozen=True)
class Model:
    """What the plan needs of a model: its parameters and, where known, its shape (for the activations, the
    attention's FLOPs and the layer that no overlap hides), and the elements of its root module (embeddings,
    final norm), of one block and of its embedding, its largest tensor."""
    name: str
    params: int
    shape: ModelShape | None = None
    root: int = 0
    block: float = 0
    embedding: int = 0


@dataclass(frozen=True)
class Inputs:
    """What a plan is made at, each settled from its flag, a results folder or an assumption."""
    micro_batch: int
    seq: int
    checkpoint: bool
    gpus: list[int]
    gpus_per_node: int
    offload: bool
    offload_param: bool
    stages: list[str]
    device: str | None  # the GPUs' names, where a results folder says
    link_curve: dict[int, float] | None  # the measured link's bus bandwidth by message bytes, within a node
    gpu_mem_gib: float
    peak_tflops: float
    mfu: float  # PaLM's: the model's FLOPs, not what checkpointing recomputes, over the peak
    intra_busbw_gbs: float
    inter_busbw_gbs: float
    host_gbs: float
    reserve_gib: float
    context_gib: float
    host_cores: int  # a node's host cores, which its ranks share for offload's host pass

    @property
    def hfu(self) -> float:
        """The hardware's FLOPs over the peak: the MFU with checkpointing's recomputed forward counted."""
        return self.mfu * hfu_per_mfu(self.checkpoint)


@dataclass(frozen=True)
class Modes:
    """A step's figure with its collectives overlapped with compute, and serial."""
    overlapped: float
    serial: float


@dataclass(frozen=True)
class Collective:
    """One collective of a step (or one of offload's copies over the host link): its bytes, its calls and its
    seconds alone, the calls' latency among them."""
    kind: str
    phase: str  # "forward", "backward" or "after"
    bytes: float
    s: float
    calls: int = 1
    latency_s: float = 0.0


@dataclass(frozen=True)
class Row:
    """One setup on G GPUs: one rank's memory, DeepSpeed's estimate of it, and its step."""
    setup: str
    gpus: int
    nodes: int
    memory: dict[str, float]  # memory.rank_memory's terms, held bytes and peak, by name
    deepspeed_estimate: int | None
    host_per_node: float
    headroom_left: float
    link: str  # the slowest link its collectives cross: "intra", "inter", or "none" on one GPU
    compute_s: float
    host_pass_s: float  # offload's pass on the host (CPU Adam and what DeepSpeed does around it), after the passes
    comm: list[Collective]
    step_s: Modes
    tokens_per_s_per_gpu: Modes
    # tokens/s per GPU against the setup's smallest G planned: above 1 where each GPU's work falls with G
    scaling: Modes | None = None

    @property
    def fits(self) -> bool:
        return self.headroom_left >= 0

    @property
    def comm_s(self) -> float:
        return sum(c.s for c in self.comm)

    def as_dict(self) -> dict[str, Any]:
        """The row as the plan's JSON carries it, the memory's terms flat among the row's figures."""
        d = {**asdict(self), "fits": self.fits, "comm_s": self.comm_s}
        flat: dict[str, Any] = {}
        for key in ROW_KEYS:
            flat.update(d[key] if key == "memory" else {key: d[key]})
        return flat


ROW_KEYS = ("setup", "gpus", "nodes", "memory", "deepspeed_estimate", "host_per_node", "headroom_left", "fits", "link",
            "compute_s", "host_pass_s", "comm", "comm_s", "step_s", "tokens_per_s_per_gpu", "scaling")


@dataclass(frozen=True)
class Plan:
    model: Model
    inputs: Inputs
    sources: dict[str, str]  # where each machine input comes from, by name
    calibration: Calibration | None
    host: HostPass  # offload's host pass per element, measured or assumed
    rows: list[Row] = field(default_factory=list)
    smallest_fitting_gpus: dict[str, int | None] = field(default_factory=dict)
    world_one: WorldOne | None = None  # each setup's step at world 1, from the calibrating run (steptime.py)

    def label(self, setup: str) -> str:
        return label(setup, self.inputs)

    def as_dict(self) -> dict[str, Any]:
        """The plan as --json prints it."""
        m = self.model
        c = self.calibration
        calibration = {**asdict(c), "uncertain": c.uncertain} if c else None
        inputs = {**asdict(self.inputs), "hfu": self.inputs.hfu}
        return {"model": {"name": m.name, "params": m.params, "shape": asdict(m.shape) if m.shape else None},
                "dtype": DTYPE, "max_gpus": MAX_GPUS, "labels": {s: self.label(s) for s in self.inputs.stages},
                "inputs": inputs, "sources": self.sources, "calibration": calibration,
                "host_pass": asdict(self.host),
                "rows": [r.as_dict() for r in self.rows], "smallest_fitting_gpus": self.smallest_fitting_gpus,
                **({"world_one": asdict(self.world_one)} if self.world_one else {})}


# -----------------------------------------------------------------------------
# one setup on G GPUs


def offloads(setup: str, offload: bool) -> bool:
    """DeepSpeed offloads the optimizer at ZeRO stages 1 to 3 only; FSDP2's CPU offload is not planned."""
    stage, engine = SETUPS[setup]
    return bool(offload) and engine == "deepspeed" and not stages.shards_nothing(stage)


def offloads_optimizer(setup: str, i: Inputs) -> bool:
    return offloads(setup, i.offload or i.offload_param)


def offloads_params(setup: str, i: Inputs) -> bool:
    """ZeRO-Infinity's offload_param: the parameters on the host too, at DeepSpeed's stage 3 only."""
    return i.offload_param and offloads(setup, True) and stages.shards_params(SETUPS[setup][0])


def label(setup: str, i: Inputs) -> str:
    return setup + ("+offload-param" if offloads_params(setup, i) else "+offload" if offloads_optimizer(setup, i)
                    else "")


def memory(setup: str, model: Model, i: Inputs, world: int, zero: dict[str, Any]) -> MemoryTerms:
    """One rank's bytes by term and its peak: memory.rank_memory, as for a RESULT, with the parameters
    partitioned evenly and no persistent ones."""
    stage, engine = SETUPS[setup]
    offload = {"optimizer": "cpu" if offloads_optimizer(setup, i) else None,
               "param": "cpu" if offloads_params(setup, i) else None}
    run = run_from({"stage": stage, "engine": engine, "model": model.name, "dtype": DTYPE, "offload": offload,
                    "micro_batch": i.micro_batch, "seq": i.seq, "checkpoint": i.checkpoint})
    return rank_memory(run, model.shape, Counts(model.params, model.embedding, model.block, model.root), zero,
                       Seat(world))


def host_per_rank(setup: str, model: Model, i: Inputs, world: int, zero: dict[str, Any],
                  m: MemoryTerms) -> float:
    """What one rank holds on the host: with stage 3's optimizer offloaded, its process's peak resident set
    (host.host_peak_bytes, with the offload sections of the config that offloads as much, 3_offload or 3_infinity:
    2.7b on one H200, 57.19 GB predicted, 57.22 measured; 1.3b with its parameters too, 35.89 against 36.35 to
    36.37), where the parameters' blocks need the model's shape; else what it offloads, its states and the CPU
    optimizer's fp32 gradients."""
    stage, _ = SETUPS[setup]
    params = offloads_params(setup, i)
    if offloads_optimizer(setup, i) and stages.shards_params(stage) and (model.shape or not params):
        config = json.loads(stages.config_path("3_infinity" if params else "3_offload").read_text())
        section = {**zero, **{key: value for key, value in config["zero_optimization"].items()
                              if key.startswith("offload_")}}
        peak = host.host_peak_bytes(stage, WIDTH, world, math.ceil(model.params / world), section,
                                    model.shape, model.params, False)  # type: ignore[arg-type]  # no shape: unread
        if peak is not None:
            return peak
    return m.host_states + m.host_buffers


def bus_bandwidth(i: Inputs, link: str, kind: str, setup: str, model: Model, zero: dict[str, Any]) -> float:
    """The bus bandwidth a collective gets: within a node, the measured link's curve (--from) read at the size
    of one of its calls, else the flag or the assumption; across nodes, the network's."""
    stage, engine = SETUPS[setup]
    if link == "intra" and i.link_curve:
        call = timing.message_bytes(kind, stage, engine, WIDTH, model.block, zero, model.params)
        return traffic.read_curve(i.link_curve, call)
    return 1e9 * (i.inter_busbw_gbs if link == "inter" else i.intra_busbw_gbs)


def collective(kind: str, phase: str, nbytes: float, setup: str, model: Model, i: Inputs, world: int,
               zero: dict[str, Any], link: str) -> Collective:
    """One collective of a step: its bytes over the link's bus bandwidth, and a ring's latency for each of its
    calls, one per block or bucket (timing.message_bytes)."""
    stage, engine = SETUPS[setup]
    call_bytes = timing.message_bytes(kind, stage, engine, WIDTH, model.block, zero, model.params)
    calls = max(1, math.ceil(nbytes / call_bytes)) if call_bytes else 1  # a model of --params alone: blocks unknown
    latency = calls * timing.ring_latency(kind, world, i.gpus_per_node)
    bandwidth = timing.ring_seconds(kind, nbytes, world, bus_bandwidth(i, link, kind, setup, model, zero))
    return Collective(kind, phase, nbytes, bandwidth + latency, calls, latency)


def step_collectives(setup: str, model: Model, i: Inputs, world: int, zero: dict[str, Any],
                     serial_copies: bool = False) -> list[Collective]:
    """One rank's collectives in a step, each over the slowest link it crosses (the network once the ranks span
    nodes), and offload's copies over the host link: after the step where the world-1 step they build on took
    them so (serial_copies)."""
    stage, engine = SETUPS[setup]
    link = "inter" if world > i.gpus_per_node else "intra"
    comm = [collective(kind, phase, nbytes, setup, model, i, world, zero, link)
            for kind, phase, nbytes in timing.collectives(stage, engine, WIDTH, model.params, model.root)]
    copies = timing.host_copies(WIDTH, model.params / world) if offloads_optimizer(setup, i) else []
    copies += timing.param_fetches(WIDTH, model.params / world) if offloads_params(setup, i) else []
    return comm + [Collective("host_copy", "after" if serial_copies else phase, nbytes, nbytes / (1e9 * i.host_gbs))
                   for phase, nbytes in copies]


def compute_seconds(model: Model, i: Inputs) -> dict[str, float]:
    """A step's compute by pass: the hardware's FLOPs (the recomputed forward too) at the HFU of the peak."""
    layers, d_model = (model.shape.layers, model.shape.d_model) if model.shape else (0, 0)
    flops = timing.pass_flops(i.micro_batch * i.seq * timing.flops_per_token(model.params, layers, d_model, i.seq),
                              i.checkpoint)
    return {p: f / (i.hfu * i.peak_tflops * 1e12) for p, f in flops.items()}


def world_one_setup(setup: str, i: Inputs) -> str:
    """The world-1 run a setup's step builds on: its own (3_offload, 3_infinity where it offloads); stage 0's for
    FSDP2, whose own cost on the host no world-1 run here measured."""
    own = setup + ("_infinity" if offloads_params(setup, i) else "_offload" if offloads_optimizer(setup, i) else "")
    return "0" if setup == "fsdp2" else own


def world_one_seconds(compute: dict[str, float], w: WorldOne, setup: str, i: Inputs, world: int) -> dict[str, float]:
    """A rank's passes without their collectives, from the world-1 clocks of the run it builds on (steptime.py): the
    longer of the host's clock (launches, the engine's own cost such as ZeRO-3's hooks) and the GPU's, whose
    optimizer pass covers a 1/G partition where the setup shards the optimizer, shared among the passes as their
    FLOPs are."""
    base = world_one_setup(setup, i)
    shards = world if setup == "fsdp2" or not stages.shards_nothing(SETUPS[setup][0]) else 1
    scale = w.clocks[base].passes_s(shards) / sum(compute.values())
    return {p: s * scale for p, s in compute.items()}


def host_pass_of(setup: str, i: Inputs) -> str:
    """The host pass an offloaded setup makes: stage 3 copies the updated fp32 weights into the GPU's from the CPU,
    converting them there (3_offload); with offload_param into the host's pinned weights (3_infinity), as stages 1
    and 2 copy them into a pinned buffer, whose copy to the GPU runs with the host copies (DeepSpeed 0.19.8's
    stage3.py and stage_1_and_2.py)."""
    three = stages.shards_params(SETUPS[setup][0])
    return "3_offload" if three and not offloads_params(setup, i) else "3_infinity"


def host_pass_seconds(setup: str, model: Model, i: Inputs, world: int, host: HostPass) -> float:
    """Offload's host pass on one rank: its 1/G partition of the parameters on its share of its node's cores, as
    the node's ranks (G, at most a node's GPUs) share them; none where the setup keeps its optimizer on the GPU."""
    if not offloads_optimizer(setup, i):
        return 0.0
    return host.seconds(host_pass_of(setup, i), model.params / world, i.host_cores / min(world, i.gpus_per_node))


def headroom_left(m: MemoryTerms, i: Inputs) -> float:
    """The GPU's memory less what the rank needs: the bytes the allocator reserves (MemoryTerms.reserved) and
    the headroom, its reserve beyond them and the CUDA context."""
    return (i.gpu_mem_gib - i.reserve_gib - i.context_gib) * 2**30 - m.reserved


def node_layout(world: int, gpus_per_node: int) -> tuple[int, int]:
    """The GPUs per node and nodes that DeepSpeed's estimator is asked of: the nodes that world needs at
    gpus_per_node, each given an even share (12 at 8 a node: 2 of 6), whose product is the world; one node of
    them all where no even share is whole (13 at 8 a node), which its arguments cannot say otherwise. Its bytes
    per GPU depend on the product alone."""
    nodes = -(-world // gpus_per_node)
    return (world // nodes, nodes) if world % nodes == 0 else (world, 1)


def estimate(setup: str, model: Model, i: Inputs, world: int) -> int | None:
    """DeepSpeed's own estimator's bytes per GPU, as a user would compute it; None for stage 0 and FSDP2."""
    stage, engine = SETUPS[setup]
    offload = {"optimizer": offloads_optimizer(setup, i), "param": offloads_params(setup, i)}
    e = predict.deepspeed_estimate(stage, model.params, model.embedding, *node_layout(world, i.gpus_per_node), offload)
    return e["device"] if e and engine == "deepspeed" else None


def row(setup: str, model: Model, i: Inputs, world: int, zero: dict[str, Any], host: HostPass,
        w: WorldOne | None = None) -> Row:
    """With w, the setup's world-1 step (where it has one) is the step's base; else the FLOPs at the MFU. Offload's
    host pass follows the passes."""
    m = memory(setup, model, i, world, zero)
    based = w is not None and world_one_setup(setup, i) in w.clocks
    comm = step_collectives(setup, model, i, world, zero, serial_copies=based)
    compute = compute_seconds(model, i)
    compute = world_one_seconds(compute, w, setup, i, world) if based else compute
    on_host = host_pass_seconds(setup, model, i, world, host)
    step = timing.step_seconds({**compute, "host": on_host}, [(c.phase, c.s) for c in comm],
                               model.shape.layers if model.shape else None)
    tokens = i.micro_batch * i.seq
    terms = {k: v for k, v in m.flat().items() if k != "breakdown"}
    return Row(setup, world, -(-world // i.gpus_per_node), terms, estimate(setup, model, i, world),
               host_per_rank(setup, model, i, world, zero, m) * min(world, i.gpus_per_node), headroom_left(m, i),
               "inter" if world > i.gpus_per_node else "intra" if world > 1 else "none", sum(compute.values()),
               on_host, comm, Modes(**step), Modes(**{mode: tokens / step[mode] for mode in MODES}))


def smallest_fitting(setup: str, model: Model, i: Inputs, zero: dict[str, Any]) -> int | None:
    """The fewest GPUs on which the rank fits with its headroom, or None up to MAX_GPUS: what it needs never
    grows with G, so a binary search finds it."""
    def fits(world: int) -> bool:
        return headroom_left(memory(setup, model, i, world, zero), i) >= 0
    first = bisect.bisect_left(range(1, MAX_GPUS + 1), True, key=fits) + 1
    return first if first <= MAX_GPUS else None


def zero_section(setup: str) -> dict[str, Any]:
    """The zero_optimization section of this project's config for the setup's stage (its sub-group and
    prefetch sizes), or DeepSpeed's defaults where there is none."""
    path = stages.config_path(SETUPS[setup][0])
    return json.loads(path.read_text()).get("zero_optimization", {}) if path.exists() else {}


def scaled(r: Row, base: Row) -> Row:
    """The row with its tokens/s per GPU against the base row's."""
    mine, theirs = r.tokens_per_s_per_gpu, base.tokens_per_s_per_gpu
    return replace(r, scaling=Modes(mine.overlapped / theirs.overlapped, mine.serial / theirs.serial))


def plan(model: Model, i: Inputs, sources: dict[str, str], calibration: Calibration | None, host: HostPass,
         world_one: WorldOne | None = None) -> Plan:
    rows = [row(s, model, i, g, zero_section(s), host, world_one) for s in i.stages for g in i.gpus]
    rows = [scaled(r, next(b for b in rows if b.setup == r.setup)) for r in rows]
    return Plan(model, i, sources, calibration, host, rows,
                {s: smallest_fitting(s, model, i, zero_section(s)) for s in i.stages}, world_one)

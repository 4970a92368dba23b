"""
A step's time at world 1, per setup, from one calibrating run (a results folder that trained stages 0-3,
3_offload and 3_infinity at one micro batch), at another micro batch or checkpointing (issue 47, item 1).
torch-free. The terms, each with its source:
- stage 0: a cost per step that no micro batch moves (the optimizer's pass, the engine's own work), per
  parameter, from the two committed micro batches of FIXED_SOURCES, plus each row's hardware FLOPs at the
  calibrating run's marginal rate;
- stages 1 and 2: stage 0 plus their own cost per step over it, as the calibrating run measured it;
- stage 3: ZeRO-3's own cost per step (its hooks, per parameter tensor) is a floor that the GPU's compute hides
  once it is longer (1.3b at micro batch 2: 0.291 s against stage 0's 0.170; at 16: 0.392 against 0.407);
- offload (3_offload, 3_infinity): stage 3 plus the host's part, CPU Adam and the copies over the host link,
  which no micro batch moves (1.590 s and 1.616 s at micro batch 2 and 16); CPU Adam scales with the
  parameters over the host's cores.
"""
import json
from dataclasses import dataclass
from pathlib import Path

from zero3bench.accounting.timing import hfu_per_mfu
from zero3bench.stages import ROOT

LOGS = ROOT / "benchmarks/logs/h200/36-step-time"
# Two calibrations of 1.3b at world 1 a micro batch apart (2 and 16, checkpointing on), which split stage 0's step
# into its cost per step and its cost per row.
FIXED_SOURCES = (LOGS / "1-default-mb2/results/20261203-125222-92vQ", LOGS / "2-mb16/results/20261203-125629-37UC")
HOST_CORES = 16  # the calibrating host's cores: one H200's machine (nvidia-h200: 16 CPU cores)
OFFLOADS = ("3_offload", "3_infinity")


@dataclass(frozen=True)
class Measured:
    """One setup's steady step at world 1, as its record says it."""
    setup: str
    model: str
    micro_batch: int
    checkpoint: bool
    step_s: float
    seq: int
    flops_per_token: float
    params: int
    param_tensors: int


NEEDED = ("model", "micro_batch", "checkpoint", "step_time_s", "seq", "flops_per_token", "params_total",
          "param_tensors")


def at_world_one(records: dict[str, dict]) -> dict[str, Measured]:
    """The world-1 runs that timed steps, by setup ("0", "3_offload", ...), of each run's first record."""
    return {name.removeprefix("stage"): Measured(name.removeprefix("stage"), *(r[k] for k in NEEDED))
            for name, r in records.items()
            if r.get("world_size") == 1 and all(r.get(k) is not None for k in NEEDED) and r["step_time_s"]}


def measured(folder: Path) -> dict[str, Measured]:
    """A results folder's world-1 runs (at_world_one), from its summary.json."""
    runs = json.loads((Path(folder) / "summary.json").read_text()).get("results", {})
    return at_world_one({name: rs[0] for name, rs in runs.items() if rs and isinstance(rs[0], dict)})


def row_flops(m: Measured, checkpoint: bool) -> float:
    """One row's hardware FLOPs in a step (the recomputed forward too)."""
    return m.seq * m.flops_per_token * hfu_per_mfu(checkpoint)


def fixed_s_per_param(a: Measured, b: Measured) -> float:
    """Stage 0's cost per step that no micro batch moves, per parameter: the intercept of two micro batches."""
    per_row = (b.step_s - a.step_s) / (b.micro_batch - a.micro_batch)
    return (a.step_s - per_row * a.micro_batch) / a.params


@dataclass(frozen=True)
class Terms:
    """What a world-1 step is made of, from one calibrating run (source)."""
    source: str
    fixed_s: float  # stage 0's cost per step (FIXED_SOURCES)
    flops_per_s: float  # the hardware's marginal rate per row, the calibrating run's
    over_stage0_s: dict[str, float]  # stages 1 and 2: their own cost per step over stage 0
    zero3_s_per_tensor: float  # ZeRO-3's own cost per step, per parameter tensor
    host_s: dict[str, float]  # offload: CPU Adam and the copies, per step, on HOST_CORES cores
    param_tensors: int


def zero3_floor(cal: dict[str, Measured], fallback: dict[str, Measured]) -> float:
    """ZeRO-3's own cost per step, per parameter tensor: the calibrating run's stage 3 where it is slower than its
    stage 0 (the floor shows), else FIXED_SOURCES' first run's."""
    run = cal if cal["3"].step_s > cal["0"].step_s else fallback
    return run["3"].step_s / run["3"].param_tensors


def terms(folder: Path, cal: dict[str, Measured] | None = None) -> Terms:
    """The terms from the calibrating folder's world-1 runs (cal, where they are read already)."""
    cal = cal or measured(folder)
    a, b = (measured(f)["0"] for f in FIXED_SOURCES)
    s0 = cal["0"]
    fixed = fixed_s_per_param(a, b) * s0.params
    return Terms(str(folder), fixed, s0.micro_batch * row_flops(s0, s0.checkpoint) / (s0.step_s - fixed),
                 {s: cal[s].step_s - s0.step_s for s in ("1", "2")},
                 zero3_floor(cal, measured(FIXED_SOURCES[0])),
                 {s: cal[s].step_s - max(cal["3"].step_s, cal["0"].step_s) for s in OFFLOADS}, s0.param_tensors)


def stage0_s(t: Terms, m: Measured, micro_batch: int, checkpoint: bool) -> float:
    return t.fixed_s + micro_batch * row_flops(m, checkpoint) / t.flops_per_s


def step_s(t: Terms, m: Measured, setup: str, micro_batch: int, checkpoint: bool, cores: int = HOST_CORES) -> float:
    """The planned step of a setup at world 1 for the model m describes (its shape, not its step)."""
    base = stage0_s(t, m, micro_batch, checkpoint)
    if setup in ("0", "1", "2"):
        return base + t.over_stage0_s.get(setup, 0.0)
    stage3 = max(base, t.zero3_s_per_tensor * m.param_tensors)
    return stage3 + t.host_s[setup] * HOST_CORES / cores if setup in OFFLOADS else stage3


@dataclass(frozen=True)
class WorldOne:
    """The planned world-1 step of each setup, at the plan's micro batch and checkpointing, from one run."""
    source: str  # the calibrating results folder
    model: str
    micro_batch: int
    checkpoint: bool
    host_cores: int
    step_s: dict[str, float]  # by setup: "0" ... "3", "3_offload", "3_infinity"


def world_one(folder: Path, cal: dict[str, Measured], model: str, micro_batch: int, checkpoint: bool,
              cores: int) -> WorldOne | None:
    """The plan's world-1 steps where the folder trained every setup at world 1 (cal) with the model planned;
    else None (a calibration of one model says nothing of another's ZeRO-3 or host cost)."""
    if not {"0", "1", "2", "3", *OFFLOADS} <= set(cal) or {m.model for m in cal.values()} != {model}:
        return None
    t = terms(folder, cal)
    return WorldOne(str(folder), model, micro_batch, checkpoint, cores,
                    {s: step_s(t, cal[s], s, micro_batch, checkpoint, cores) for s in cal})

"""
A step's time at world 1, per setup, from one calibrating run (a results folder that trained stages 0-3,
3_offload and 3_infinity at one micro batch) and the hardware constants below, at another micro batch or
checkpointing (issue 47, item 1). torch-free.

A step is the longer of two clocks through its passes, then what the host does alone:
- the host's clock: launching each pass (forward, backward, and with checkpointing the forward again), per
  parameter tensor (a block's modules, and so its kernels, go with its tensors); and each engine's own cost per
  step over stage 0's, per parameter tensor: ZeRO-3's hooks, which neither the micro batch nor the recomputed
  forward moves (stage 3 less stage 0 where both wait on the host: 0.121 s with checkpointing in 36-step-time's
  92vQ; without it, stage 3's 0.243 and 0.236 s at micro batch 2 and 8 in 38-step-time2 leave 0.126 and 0.119
  over the launches);
- the GPU's clock: the optimizer's pass, per parameter, and each row's hardware FLOPs (the recomputed forward's
  too) at the GPU's rate. An offloaded optimizer leaves the GPU no pass of its own: 3_offload's step grows 0.026 s
  from micro batch 2 to 16 (36-step-time), where stage 0's cost per step would have made it 0.14;
- offload: the copies over the host link (timing.host_copies, and param_fetches with offload_param) and the host
  pass, which no pass hides: DeepSpeed's step on the CPU, its CPU Adam and what stage 3 does around it (the
  gradients unscaled, the updated weights copied into the GPU's, or with offload_param into the host's). Every run
  times it on its host (accounting/hostpass.py), in core-seconds per element (HostPass); where the calibrating
  folder ran the offload setup at world 1, what its step leaves after the passes and the copies stands instead;
  where neither, an H200 host's (ASSUMED_HOST_CORE_S), which the plan says it assumed.

The calibrating run sets the clock that holds it, as the constants judge which one does: at micro batch 2 with
checkpointing (92vQ) the host's, the launches and each engine's own cost; at 16 (37UC) the GPU's rate. The
constants stand for the rest. Fitted on 5 of the 26 world-1 runs that tests/test_plan.py checks (two stage 0 runs
for the GPU, three stage 3 runs for ZeRO-3's hooks) and on three runs outside them (the launches); from either
calibrating run each of the 26 is planned within 15%: the worst of the 18 that 92vQ's plan holds out is 11.6%, of
the 15 that 37UC's holds out 8.7%.
"""
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from zero3bench.accounting import timing
from zero3bench.accounting.predict import WIDTH
from zero3bench.options import BadInput
from zero3bench.parts import HostPass as Probe

# The H200's rate on a row's hardware FLOPs and its optimizer's pass per parameter: the line through stage 0 of
# 1.3b without checkpointing at micro batch 8 and 16 (benchmarks/logs/h200/38-step-time2: 9DfY 0.216 s, 8zcB
# 0.346 s), 534.5 TFLOP/s and 0.086 s; it gives micro batch 2 (7Iky, 0.118 s) 0.119 s.
GPU_FLOPS_PER_S = 534.5e12
OPTIMIZER_S_PER_PARAM = 6.561e-11
# The host's time to launch one pass, per parameter tensor: stage 0 of 1.3b (292 tensors) at micro batch 2 with
# checkpointing (3 passes) in three 30-step runs alone on one H200 (benchmarks/logs/h200: 26-off-default,
# 28-suite-matrix and 29-live's steady30: 0.183, 0.175 and 0.166 s), none of the 26.
LAUNCH_S_PER_TENSOR_PASS = 1.992e-4
# Each engine's own host cost per step over stage 0's, per parameter tensor, by stage. Stage 3's is ZeRO-3's
# hooks: stage 3 of 1.3b where its steps wait on the host, less the launches above (38-step-time2: ALeK 0.265 s
# at micro batch 8 with checkpointing, 7Iky 0.243 at 2 and 9DfY 0.236 at 8 without; 0.112 s). Stages 1 and 2
# partition nothing at world 1: none.
OWN_S_PER_TENSOR = {1: 0.0, 2: 0.0, 3: 3.841e-4}
# A stage's step at world 1 may fall this far below the launches that stage 0's step sets: stage 1 and 2 there are
# stage 0 again, whose steps differ by a few percent (92vQ: stage 1 0.190 s, 2 0.180, 0 0.170)
NOISE = 0.15
HOST_CORES = 16  # the calibrating host's cores: one H200's machine (nvidia-h200: 16 CPU cores)
HOST_GBS = 50.0  # its host link, not measured: PCIe 5.0 x16, about 0.8 of 64 GB/s, as plan.py's --host-gbs
OFFLOADS = {"3_offload": frozenset({"optimizer"}), "3_infinity": frozenset({"optimizer", "param"})}
# Offload's host pass where no run of the folder timed it, in core-seconds per element: what the offload steps of
# 36-step-time's 92vQ left after their passes and copies, 1.194 s (3_offload) and 0.450 s (3_infinity) for
# 1,313,722,368 elements on one H200 machine's 16 cores (benchmarks/logs/plan/step-check-18aea3b.txt)
ASSUMED_HOST_CORE_S = {"3_offload": 1.194 * HOST_CORES / 1_313_722_368,
                       "3_infinity": 0.450 * HOST_CORES / 1_313_722_368}
ASSUMED_HOST = ("assumed: what 36-step-time's 92vQ's {setup} step left after its passes and copies on an H200 "
                "machine's 16 cores (benchmarks/logs/plan/step-check-18aea3b.txt), not a measurement of yours")


@dataclass(frozen=True)
class Measured:
    """One setup's steady step at world 1, as its record says it."""
    setup: str
    model: str
    stage: int
    micro_batch: int
    checkpoint: bool
    step_s: float
    seq: int
    flops_per_token: float
    params: int
    param_tensors: int
    offloads: frozenset[str]  # what it keeps on the host: "optimizer", "param"


NEEDED = ("model", "stage", "micro_batch", "checkpoint", "step_time_s", "seq", "flops_per_token", "params_total",
          "param_tensors")


def at_world_one(records: dict[str, dict]) -> dict[str, Measured]:
    """The world-1 runs that timed steps, by setup ("0", "3_offload", ...), of each run's first record."""
    return {name.removeprefix("stage"): Measured(name.removeprefix("stage"), *(r[k] for k in NEEDED),
                                                 frozenset(k for k, v in (r.get("offload") or {}).items() if v))
            for name, r in records.items()
            if r.get("world_size") == 1 and all(r.get(k) is not None for k in NEEDED) and r["step_time_s"]}


def measured(folder: Path) -> dict[str, Measured]:
    """A results folder's world-1 runs (at_world_one), from its summary.json."""
    runs = json.loads((Path(folder) / "summary.json").read_text()).get("results", {})
    return at_world_one({name: rs[0] for name, rs in runs.items() if rs and isinstance(rs[0], dict)})


# -----------------------------------------------------------------------------
# the two clocks and the host's part alone


def passes(checkpoint: bool) -> int:
    """The passes the host launches in a step: forward and backward, and with checkpointing the forward again."""
    return 3 if checkpoint else 2


def row_flops(m: Measured, checkpoint: bool) -> float:
    """One row's hardware FLOPs in a step (the recomputed forward too)."""
    return m.seq * m.flops_per_token * timing.hfu_per_mfu(checkpoint)


def optimizer_s(m: Measured) -> float:
    """The optimizer's pass on the GPU, where the GPU runs the optimizer."""
    return 0 if "optimizer" in m.offloads else OPTIMIZER_S_PER_PARAM * m.params


def flops_s(m: Measured, micro_batch: int, checkpoint: bool, flops_per_s: float) -> float:
    """The rows' hardware FLOPs at the GPU's rate."""
    return micro_batch * row_flops(m, checkpoint) / flops_per_s


def gpu_s(m: Measured, micro_batch: int, checkpoint: bool, flops_per_s: float) -> float:
    """The GPU's clock: the optimizer's pass and the rows' FLOPs at the GPU's rate."""
    return optimizer_s(m) + flops_s(m, micro_batch, checkpoint, flops_per_s)


def launch_s(launch_s_per_tensor_pass: float, m: Measured, checkpoint: bool) -> float:
    return launch_s_per_tensor_pass * m.param_tensors * passes(checkpoint)


def copies_s(m: Measured, host_gbs: float) -> float:
    """Offload's copies over the host link in a step: the gradients out and the updated weights back, and with
    offload_param the weights in for forward and backward (timing.py's bytes)."""
    copies = timing.host_copies(WIDTH["bf16"], m.params) if "optimizer" in m.offloads else []
    copies += timing.param_fetches(WIDTH["bf16"], m.params) if "param" in m.offloads else []
    return sum(nbytes for _, nbytes in copies) / (host_gbs * 1e9)


@dataclass(frozen=True)
class Terms:
    """What a world-1 step is made of: the constants, and what the calibrating run (source) measured in their place
    where its clock showed it."""
    source: str
    gpu_flops_per_s: float  # its stage 0's where the GPU holds it, else GPU_FLOPS_PER_S
    launch_s_per_tensor_pass: float  # its stage 0's where the host holds it, else LAUNCH_S_PER_TENSOR_PASS
    own_s_per_tensor: dict[int, float]  # by stage: its own where the host holds it, else OWN_S_PER_TENSOR's
    host_step_s: dict[str, float]  # by offload setup it ran: what its step left after its passes and copies
    host: "HostPass"  # the host pass per element: host_step_s's where it ran the setup, else its runs' probe's


def host_s(t: Terms, m: Measured, checkpoint: bool) -> float:
    """The host's clock through the passes: launching them, and the engine's own cost (ZeRO-3's hooks)."""
    return launch_s(t.launch_s_per_tensor_pass, m, checkpoint) + t.own_s_per_tensor.get(m.stage, 0) * m.param_tensors


@dataclass(frozen=True)
class Clocks:
    """A step's two clocks through its passes: the host's, and the GPU's (its FLOPs, then the optimizer's pass)."""
    host_s: float
    flops_s: float
    optimizer_s: float

    def passes_s(self, shards: int = 1) -> float:
        """The longer clock, with the GPU's optimizer pass over a 1/shards partition of the parameters."""
        return max(self.host_s, self.flops_s + self.optimizer_s / shards)


def clocks(t: Terms, m: Measured, micro_batch: int, checkpoint: bool) -> Clocks:
    return Clocks(host_s(t, m, checkpoint), flops_s(m, micro_batch, checkpoint, t.gpu_flops_per_s), optimizer_s(m))


def passes_s(t: Terms, m: Measured, micro_batch: int, checkpoint: bool) -> float:
    return clocks(t, m, micro_batch, checkpoint).passes_s()


def step_s(t: Terms, m: Measured, micro_batch: int, checkpoint: bool, cores: int | None = None,
           host_gbs: float = HOST_GBS) -> float:
    """The planned step at world 1 of m's setup (its shape and setup, not its step): the longer clock through the
    passes, then offload's copies and its host pass on the host's cores (by default those it was measured on)."""
    alone = copies_s(m, host_gbs) + t.host.seconds(m.setup, m.params, cores or t.host.cores) if m.offloads else 0
    return passes_s(t, m, micro_batch, checkpoint) + alone


# -----------------------------------------------------------------------------
# offload's host pass, per element


@dataclass(frozen=True)
class HostPass:
    """Offload's pass on the host in a step, CPU Adam and what DeepSpeed does around it, by offload setup, in
    core-seconds per element of the partition a rank steps: n elements on c cores take core_s * n / c seconds."""
    core_s: dict[str, float]  # by setup: "3_offload", "3_infinity"
    sources: dict[str, str]  # by setup: where its figure comes from, "measured ..." or "assumed: ..."
    cores: int  # the cores it was measured on, per node: a plan's default --host-cores
    host_cores: int | None = None  # the most cores a measuring run's host had: a plan of more is refused

    def seconds(self, setup: str, elements: float, cores: float) -> float:
        return self.core_s[setup] * elements / cores

    def assumed(self, setup: str) -> bool:
        return self.sources[setup].startswith("assumed")


def probed(p: Probe) -> dict[str, float]:
    """One rank's probe (parts.HostPass) in core-seconds per element by setup: the gradients unscaled and CPU Adam,
    then the weights copied into the GPU's (3_offload; a GPU's rank alone times it) or the host's (3_infinity)."""
    if p.why_not or not (p.elements and p.threads and p.unscale_s is not None and p.adam_s is not None):
        return {}
    copies = {"3_offload": p.to_gpu_s, "3_infinity": p.to_host_s}
    return {s: (p.unscale_s + p.adam_s + copy) * p.threads / p.elements for s, copy in copies.items()
            if copy is not None}


def node_cores(p: Probe, ranks: int) -> int:
    """The cores that a probe's rank and the other ranks of its node ran on together."""
    return min(p.threads * ranks, p.host_cores or p.threads * ranks)


def host_pass(probes: list[tuple[Probe, int]], where: str = "") -> HostPass:
    """The host pass from the probes of a folder's ranks (each with its node's ranks, which shared its cores), else
    the assumption; its cores are those its probes' ranks ran on, per node. Of the probes made on those cores and on
    the largest slice (a smaller one runs in the caches; one thread a rank costs a fraction of 16 threads' core-s),
    the fastest, since what else a host does only slows a probe: h200/47-offload-step's calibrating folder timed
    one host's pass at 27.9 and 16.2 core-ns per element, and its offload runs' steps left it 15.5 to 17.4."""
    rates = [(probed(p), p, ranks) for p, ranks in probes if probed(p)]
    core_s = {s: ASSUMED_HOST_CORE_S[s] for s in OFFLOADS}
    sources = {s: ASSUMED_HOST.format(setup=s) for s in OFFLOADS}
    if not rates:
        return HostPass(core_s, sources, HOST_CORES)
    cores = statistics.median_low([node_cores(p, ranks) for _, p, ranks in rates])
    alike = [(r, p) for r, p, ranks in rates if node_cores(p, ranks) == cores]
    largest = max(p.elements for _, p in alike)
    for setup in OFFLOADS:
        figures = [(r[setup], p) for r, p in alike if p.elements == largest and setup in r]
        if figures:
            core_s[setup], fastest = min(figures, key=lambda figure: figure[0])
            sources[setup] = f"measured by DeepSpeedCPUAdam's probe in {where} ({said(fastest, setup)})"
    return HostPass(core_s, sources, cores, max(p.host_cores or 0 for _, p, _ in rates) or None)


def said(p: Probe, setup: str) -> str:
    copy = "the GPU's" if setup == "3_offload" else "the host's pinned"
    return (f"{p.elements:,} elements on {p.threads} threads of {p.host_cores} cores, {p.cpu}: CPU Adam "
            f"{p.elements / p.adam_s / 1e9:.3g}G elements/s, with the gradients unscaled and the weights copied into "
            f"{copy}")


# -----------------------------------------------------------------------------
# the terms from a calibrating run


def contradiction(folder: Path | str, what: str) -> BadInput:
    return BadInput(f"--from {folder}: {what}: its figures contradict themselves")


def gpu_rate(folder: Path | str, s0: Measured) -> float:
    """The GPU's rate on stage 0's rows, where its clock holds stage 0's step: the step less the optimizer's pass."""
    if s0.step_s <= optimizer_s(s0):
        raise contradiction(folder, f"stage 0's step ({s0.step_s:.3g} s) is no longer than its optimizer's pass on "
                                    f"the GPU alone ({optimizer_s(s0):.3g} s)")
    return s0.micro_batch * row_flops(s0, s0.checkpoint) / (s0.step_s - optimizer_s(s0))


def own_cost(folder: Path | str, m: Measured, launches: float) -> float:
    """A stage's own cost per tensor where the host holds its step: the step less the launches; a stage 1 or 2 at
    world 1 is stage 0 again, and within NOISE of its launches it has none. Further below them it contradicts
    stage 0, whose step set them."""
    left = m.step_s - launches
    if left < -NOISE * m.step_s:
        raise contradiction(folder, f"stage {m.stage}'s step ({m.step_s:.3g} s) is shorter than the launches of its "
                                    f"passes that stage 0's step sets ({launches:.3g} s)")
    return max(left, 0.0) / m.param_tensors


def terms(folder: Path, cal: dict[str, Measured] | None = None, host: HostPass | None = None) -> Terms:
    """The terms from the calibrating folder's world-1 runs (cal, where they are read already): its stage 0 sets
    the GPU's rate or the launches, whichever clock the constants say holds it; stages 1-3 their own cost where
    the folder ran them and the host holds them; each offload setup it ran its host pass, what its step leaves after
    the passes and the copies, else the folder's probes' (host, where they are read already)."""
    cal = cal or measured(folder)
    s0 = cal["0"]
    rate, launch = GPU_FLOPS_PER_S, LAUNCH_S_PER_TENSOR_PASS
    if gpu_s(s0, s0.micro_batch, s0.checkpoint, rate) >= launch_s(launch, s0, s0.checkpoint):
        rate = gpu_rate(folder, s0)
    else:
        launch = s0.step_s / (s0.param_tensors * passes(s0.checkpoint))
    own = dict(OWN_S_PER_TENSOR)
    for stage, m in ((stage, cal[str(stage)]) for stage in OWN_S_PER_TENSOR if str(stage) in cal):
        launches = launch_s(launch, m, m.checkpoint)
        if gpu_s(m, m.micro_batch, m.checkpoint, rate) < launches + own[stage] * m.param_tensors:
            own[stage] = own_cost(folder, m, launches)
    host = host or host_pass_of(folder)
    t = Terms(str(folder), rate, launch, own, {}, host)
    left = {s: cal[s].step_s - passes_s(t, cal[s], cal[s].micro_batch, cal[s].checkpoint) - copies_s(cal[s], HOST_GBS)
            for s in OFFLOADS if s in cal}
    for s in (s for s, seconds in left.items() if seconds <= 0):
        raise contradiction(folder, f"stage{s}'s step ({cal[s].step_s:.3g} s) leaves nothing for its host pass after "
                                    f"its passes and its copies over the host link at {HOST_GBS:g} GB/s")
    ran = {s: seconds * host.cores / cal[s].params for s, seconds in left.items()}
    measured_here = {s: f"measured: what stage{s}'s step in {folder} left after its passes and copies" for s in ran}
    return replace(t, host_step_s=left, host=replace(host, core_s={**host.core_s, **ran},
                                                     sources={**host.sources, **measured_here}))


def host_pass_of(folder: Path) -> HostPass:
    """A results folder's host pass (host_pass), from its summary.json's records as they are."""
    runs = json.loads((Path(folder) / "summary.json").read_text()).get("results", {})
    records = [r for rs in runs.values() for r in rs if isinstance(r, dict) and r.get("host_pass")]
    return host_pass([(Probe.from_dict(r["host_pass"]), r.get("ranks_per_node") or 1) for r in records], str(folder))


@dataclass(frozen=True)
class WorldOne:
    """The planned world-1 step of each setup, at the plan's micro batch and checkpointing, from one run, and its
    parts that a plan on G GPUs builds on (cluster.py): the passes, and offload's host pass."""
    source: str  # the calibrating results folder
    model: str
    micro_batch: int
    checkpoint: bool
    host_cores: int
    ran: list[str]  # the setups the folder ran at world 1; the others are planned on its stage 0 or 3
    step_s: dict[str, float]  # by setup: "0" ... "3", "3_offload" and "3_infinity"
    clocks: dict[str, Clocks]  # by setup: the two clocks through its passes
    host: HostPass  # offload's host pass: from the folder's offload runs where it ran them, else its probes'


def world_one(folder: Path, cal: dict[str, Measured], model: str, micro_batch: int, checkpoint: bool,
              cores: int | None, host_gbs: float, host: HostPass | None = None) -> WorldOne | None:
    """The plan's world-1 steps where the folder trained stage 0 at world 1 (cal) with the model planned: stages 1
    to 3 on their own runs, or on stage 0's with the constants' own cost; an offload setup on its own run, else on
    stage 3's with its host pass. Else None (a calibration of one model says nothing of another's ZeRO-3 or host
    cost)."""
    if "0" not in cal or {m.model for m in cal.values()} != {model}:
        return None
    t = terms(folder, cal, host)
    runs = {**{str(stage): replace(cal["0"], setup=str(stage), stage=stage) for stage in OWN_S_PER_TENSOR}, **cal}
    runs = {**{s: replace(runs["3"], setup=s, offloads=kept) for s, kept in OFFLOADS.items()}, **runs}
    cores = cores or t.host.cores
    return WorldOne(str(folder), model, micro_batch, checkpoint, cores, sorted(cal),
                    {s: step_s(t, m, micro_batch, checkpoint, cores, host_gbs) for s, m in runs.items()},
                    {s: clocks(t, m, micro_batch, checkpoint) for s, m in runs.items()}, t.host)

"""
What plan.py's --from takes of a results folder: its summary.json read once, its records checked (inputs.py), what
they say of the machine (the GPU's memory and peak, the link's bus bandwidth, the MFU of its steady steps, the runs
at world 1, the host pass its ranks timed), and what the user should know of a plan made from it. torch-free.
"""
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from zero3bench.accounting import timing
from zero3bench.formatting import gib
from zero3bench.options import BadInput
from zero3bench.parts import HostPass
from zero3bench.planning import steptime
from zero3bench.planning.inputs import (MAKE_RUN, MIN_STEADY, STEADY_FROM, Calibration, calibration, read_records,
                                        steady_times)
from zero3bench.result import RankResult, shape_of


# -----------------------------------------------------------------------------
# what a results folder says of the machine


class Measured(NamedTuple):
    """A machine input that a results folder measured, and where."""
    value: float
    source: str


@dataclass(frozen=True)
class Folder:
    """What plan.py's --from takes of a results folder."""
    path: Path
    measured: dict[str, Measured]  # by machine input (ASSUMED's keys)
    device: str | None  # the GPUs' names
    curve: dict[int, float] | None  # the link's bus bandwidth by message bytes, within a node
    calibration: Calibration | None
    rehearsals: list[str]  # the runs whose ranks shared a GPU: their speed is not real, their memory is
    at_world_one: dict[str, steptime.Measured]  # its runs on one GPU alone, by setup, for steptime.world_one
    probes: list[tuple[HostPass, int]]  # its ranks' host passes as they timed them, each with its node's ranks
    unprobed: list[str]  # why a rank could not time its host pass


def median_of(values: list[float | None]) -> float | None:
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if measured else None


def one_node(results: list[RankResult]) -> bool:
    """Whether each rank's world fits its node; a record that does not say its world or its node's ranks is not
    known to, and its link counts as the network's."""
    return all(r.world_size and r.ranks_per_node and r.world_size <= r.ranks_per_node for r in results)


def machine(runs: dict[str, list[RankResult]], path: Path, calibrated: Calibration | None) -> dict[str, Measured]:
    """Each machine input a folder measured, from the first run that measured it, each figure the median over its
    ranks: the GPU's memory and peak from any run; the MFU and the link's bus bandwidth (at the old probe's
    256 MiB) from runs whose ranks each had a GPU of their own, within a node where all its ranks were on one."""
    source = f"measured in {path}"
    found = {}
    if calibrated:
        few = f"; UNCERTAIN: fewer than {MIN_STEADY}" if calibrated.uncertain else ""
        found["mfu"] = Measured(calibrated.mfu, f"{source} ({calibrated.run}, micro batch {calibrated.micro_batch}, "
                                                f"over {calibrated.steady_steps} steady steps{few})")
    for name, rs in runs.items():
        memory = median_of([r.peaks.device_total_bytes for r in rs])
        peak = median_of([r.peak_tflops for r in rs])
        if memory:
            found.setdefault("gpu_mem_gib", Measured(gib(memory), source))
        if peak:
            found.setdefault("peak_tflops", Measured(peak, source))
        link = median_of([r.link_busbw_at(1 << 28) for r in rs]) if not rs[0].rehearsal else None
        if link:
            found.setdefault("intra_busbw_gbs" if one_node(rs) else "inter_busbw_gbs", Measured(link / 1e9, source))
    return found


def cpu_runs(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The runs whose ranks were CPU processes, which measure no GPU."""
    return [name for name, rs in records.items() if any(d.get("mem_kind") not in (None, "cuda") for d in rs)]


def flops_problem(d: dict[str, Any], r: RankResult) -> str | None:
    """Where a record's FLOPs per token are not those of its parameters and shape (timing.flops_per_token, which
    the run recorded them by), what they should be; None where they are, or it recorded none."""
    params, seq, shape = r.shards.params_total, r.run.seq, shape_of(r)
    if d.get("flops_per_token") is None or not (params and seq):
        return None
    if shape is None:
        return None if r.flops_per_token >= 6 * params else f"at least 6 per parameter, {6 * params:,}"
    expected = timing.flops_per_token(params, shape.layers, shape.d_model, seq)
    return None if math.isclose(r.flops_per_token, expected, rel_tol=1e-9) else (
        f"{expected:,}: 6 per parameter of its {params:,} and 12 x {shape.layers} layers x d_model {shape.d_model} "
        f"x seq {seq}")


def results(records: dict[str, list[dict[str, Any]]], path: Path) -> dict[str, list[RankResult]]:
    """Each run's records read as results; one whose FLOPs per token contradict its own parameters is refused."""
    runs = {name: [RankResult.from_dict(d) for d in rs] for name, rs in records.items() if rs}
    for name, rs in runs.items():
        for i, (d, r) in enumerate(zip(records[name], rs)):
            wanted = flops_problem(d, r)
            if wanted:
                raise BadInput(f"--from {path / 'summary.json'}: results.{name}[{i}].flops_per_token is "
                               f"{d['flops_per_token']:,}: it must be {wanted}")
    return runs


def read_folder(path: Path) -> Folder:
    """A results folder for --from: its summary.json read once, each record checked, and what it says of the
    machine. A folder of CPU runs is refused; a rehearsal's runs give the GPU's memory, not its speed."""
    records = read_records(path)
    cpu = cpu_runs(records)
    if cpu:
        raise BadInput(f"--from {path}: {', '.join(cpu)} ran as CPU processes, which measure no GPU: plan from a "
                       f"GPU run's folder ({MAKE_RUN})")
    runs = results(records, path)
    rehearsals = [name for name, rs in runs.items() if rs[0].rehearsal]
    own_gpus = {name: rs for name, rs in runs.items() if name not in rehearsals}
    calibrated = calibration(own_gpus, path)
    devices = sorted({r.env.device for rs in runs.values() for r in rs if r.env and r.env.device})
    curves = [r.link_busbw for rs in own_gpus.values() for r in rs
              if isinstance(r.link_busbw, dict) and one_node([r])]
    curve = {int(k): v for k, v in curves[0].items()} if curves else None
    alone = steptime.at_world_one({name: records[name][0] for name, rs in own_gpus.items() if steady_times(rs[0])})
    passes = [(r.host_pass, r.ranks_per_node or 1) for rs in own_gpus.values() for r in rs if r.host_pass]
    return Folder(path, machine(runs, path, calibrated), ", ".join(devices) or None, curve, calibrated, rehearsals,
                  alone, [(h, ranks) for h, ranks in passes if not h.why_not],
                  sorted({h.why_not for h, _ in passes if h.why_not}))


# -----------------------------------------------------------------------------
# what the user should know of a plan made from a folder


@dataclass(frozen=True)
class Planned:
    """What a plan is made for, against which its calibrating run is held."""
    model: str
    seq: int
    micro_batch: int
    mfu_given: bool


def folder_warnings(folder: Folder, planned: Planned) -> list[str]:
    """What the user should know of a plan made from a results folder: a rehearsal's speed left out; the MFU's run
    too short, or absent; the plan of another model, sequence or micro batch than the run that measured its MFU."""
    at = f"--from {folder.path}"
    warnings = []
    if folder.rehearsals:
        are = "is a rehearsal" if len(folder.rehearsals) == 1 else "are rehearsals"
        warnings.append(f"{at}: {', '.join(folder.rehearsals)} {are} (ranks sharing one GPU), whose speed is not "
                        f"real: the plan takes the GPU's memory from a rehearsal, not its MFU, its link or "
                        f"offload's host pass")
    c = folder.calibration
    if planned.mfu_given:
        return warnings
    if not c:
        return warnings + [f"{at}: no run with a GPU per rank has a steady step (step {STEADY_FROM} or later, not "
                           f"the profiled last): the MFU is assumed; {MAKE_RUN}"]
    for measured, plans, was, will in ((c.model, planned.model, "on {}", "for {}"),
                                       (c.seq, planned.seq, "at seq {}", "at seq {}"),
                                       (c.micro_batch, planned.micro_batch, "at micro batch {}", "at {}")):
        if measured != plans:
            warnings.append(f"{at}: MFU {c.mfu:.3g} measured {was.format(measured)}, planned {will.format(plans)}: "
                            f"another model, sequence or micro batch reaches another MFU")
    if c.uncertain:
        warnings.append(f"{at}: MFU {c.mfu:.3g} from {c.steady_steps} steady step(s) of {c.run}, fewer than "
                        f"{MIN_STEADY}: uncertain; {MAKE_RUN}")
    return warnings

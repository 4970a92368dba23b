"""
What plan.py reads, checked before it plans: each number of its command line within a range, a results folder's
records of the types that plan.py reads, and the compute rate of a run's steady steps (what the folder says of the
machine: folder.py). torch-free.
"""
import argparse
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from zero3bench.accounting import timing
from zero3bench.options import BadInput
from zero3bench.result import RankResult

# Steps 1 to 3 are slower than the rest: step 1 allocates and selects kernels, and steps 2 and 3 ran 5 to 30%
# over the steady time on H200s (benchmarks/logs/h200/21-verdict/1-cold/results/20261201-110054-sG16: 0.366 and
# 0.348 s against a median of 0.30 over steps 4-13; h200x2/13-fsdp2/15-final5: FSDP2's 0.120 and 0.091 s against
# 0.093-0.099). The profiled last step is slower again (comm_s marks it).
STEADY_FROM = 4
# fewer steady steps than this give an MFU marked uncertain: on one H200 (26-off-default) stage 0's steps kept
# quickening to about step 25, and a 10-step run's 7 steady steps gave MFU 0.081 where a 30-step run's 27 gave 0.096
MIN_STEADY = 20
# The micro batch of a run to plan from. At 2 an H200's steps wait on the host (0.15 to 0.2 s, HFU 0.10 to 0.14, MFU
# 3/4 of it), and a 10-step and a 30-step run gave MFUs 8 to 19% apart in three pairs; at 16 (0.40 s a step, MFU 0.33
# to 0.35) two pairs were 2.0% and 0.9% apart (benchmarks/logs/h200/30-steady/3-steady).
PLAN_FROM_MICRO_BATCH = 16
MAKE_RUN = (f"bash run.sh --ranks 1 --steps 30 --micro-batch {PLAN_FROM_MICRO_BATCH} makes a run to plan from, at a "
            "micro batch that keeps the GPU busy")


class Assumed(NamedTuple):
    """A machine input's default, an assumption, and where it comes from."""
    value: float
    why: str


ASSUMED = {
    "gpu_mem_gib": Assumed(139.8, "an H200 as torch sees it (150,109,880,320 bytes here; NVIDIA's datasheet: 141 GB)"),
    "peak_tflops": Assumed(989.0, "H100/H200 SXM dense BF16, NVIDIA's datasheets (1,979 with sparsity)"),
    "mfu": Assumed(0.4, "a typical figure for a dense transformer, not a measurement of yours"),
    "gpus_per_node": Assumed(8, "an HGX/DGX H100 or H200 node"),
    "intra_busbw_gbs": Assumed(360.0, "NVLink 4 within a node: about the ring bus bandwidth of NCCL's published "
                                      "all-reduce figures on 8 H100 SXM, without NVLink SHARP"),
    "inter_busbw_gbs": Assumed(45.0, "400 Gb/s InfiniBand per GPU = 50 GB/s, at about 0.9 efficiency"),
    "host_gbs": Assumed(50.0, "PCIe 5.0 x16: 64 GB/s each way, about 0.8 of it achieved (offload's copies only)"),
    "reserve_gib": Assumed(6.0, "the allocator's reserve beyond the reserved bytes predicted: at most 5.88 GiB in any "
                                "committed GPU run of the project's configs that records its config (Qwen1.5-MoE "
                                "cut to 2 layers, 60 experts, at stage 3 on one H100, h100/7-families, which the 5.5 "
                                "GiB assumed before did not cover; 5.07 for 2.7b at stage 2 on 4 rehearsed ranks, "
                                "32-s12; 4.73 for stage 0 at micro batch 8 without checkpointing on 2, "
                                "28-suite-matrix); stages 1 "
                                "and 2, in older runs, up to 4.62 GiB (h200/5-stages-offload-cap); the original "
                                "design's config, whose 5e8-element buckets it does not plan, up to 8.42 GiB "
                                "(28-suite-matrix)"),
    "context_gib": Assumed(0.5, "the CUDA context, NCCL's and cuBLAS's own memory outside torch's allocator: not "
                                "measured here, as torch does not see it"),
}


@dataclass(frozen=True)
class Span:
    """The numbers a machine input may take, from low to high, and what the ends are."""
    low: float
    high: float
    why: str


# Below these ends a plan's times or memory mean nothing (a step of years, a GPU that holds no model); above, no
# machine is near.
SPANS = {
    "gpu_mem_gib": Span(1, 2**20, "1 GiB to 1 PiB"),
    "peak_tflops": Span(0.1, 1e6, "a CPU core's order to 1,000 H200s"),
    "mfu": Span(1e-6, 1, "a millionth of the peak, a toy model's order on a GPU, to all of it"),
    "intra_busbw_gbs": Span(0.1, 1e5, "gigabit Ethernet to 1,000 NVLinks"),
    "inter_busbw_gbs": Span(0.1, 1e5, "gigabit Ethernet to 1,000 NVLinks"),
    "host_gbs": Span(0.1, 1e5, "gigabit Ethernet to 1,000 PCIe links"),
    "reserve_gib": Span(0, 2**20, "none to 1 PiB"),
    "context_gib": Span(0, 2**20, "none to 1 PiB"),
}


def between(kind: type[int] | type[float], low: float, high: float, why: str,
            low_allowed: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number of kind (int or float) from low (or above it) to high; why says what
    the range is."""
    def parse(text: str) -> float:
        span = f"from {number(low)} to" if low_allowed else f"above {number(low)} and at most"
        wanted = f"must be {'a whole number' if kind is int else 'a number'} {span} {number(high)} ({why}), not {text}"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(wanted) from None
        if not (math.isfinite(value) and (low <= value if low_allowed else low < value) and value <= high):
            raise argparse.ArgumentTypeError(wanted)
        return value
    parse.__name__ = kind.__name__
    return parse


def number(x: float) -> str:
    """A range's end as a user would write it: 1,048,576, or 1e+14."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e9 else f"{x:g}"


# -----------------------------------------------------------------------------
# a results folder's records, checked for what plan.py reads of them

# whole numbers (and their least), positive finite numbers, and true or false
WHOLE = {"rank": 0, "stage": 0, "world_size": 1, "ranks_per_node": 1, "gpus": 1, "micro_batch": 1, "seq": 1}
POSITIVE = ("device_total_bytes", "peak_tflops", "flops_per_token")
BOOLEAN = ("checkpoint", "rehearsal")
# what a record that has steps must hold, as its speed is worked out from them
FOR_SPEED = ("micro_batch", "seq", "gpus")
# the ends of what a record may measure, as those of the flags it stands for
RECORD_SPANS = {"device_total_bytes": (SPANS["gpu_mem_gib"], 2**30), "peak_tflops": (SPANS["peak_tflops"], 1),
                "link_busbw": (SPANS["intra_busbw_gbs"], 1e9),
                "flops_per_token": (Span(6, 1e20, "6 per parameter of one parameter, to 1e20"), 1),
                "time_s": (Span(1e-6, 1e6, "a microsecond to 11 days"), 1),
                "mfu": (Span(1e-9, 1, "a fraction of the peak, not a percentage"), 1),
                # a host pass's elements per second on all its threads: 1,000 times slower than one core of 2010
                # to 1,000 times faster than 16 cores of an H200 machine
                "host_rate": (Span(1e5, 1e12, "1e5 to 1e12 elements a second"), 1)}
# a record's host pass (parts.HostPass): whole numbers, and the seconds of each part on its elements; a GPU's rank
# times the copy into the GPU's weights too
HOST_WHOLE = ("elements", "threads", "host_cores")
HOST_PARTS = ("unscale_s", "adam_s", "to_host_s")


def positive_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def within(key: str, value: float) -> bool:
    span, unit = RECORD_SPANS[key]
    return span.low * unit <= value <= span.high * unit


def spanned(key: str) -> str:
    span, unit = RECORD_SPANS[key]
    return f"from {number(span.low * unit)} to {number(span.high * unit)} ({span.why})"


def step_problem(s: Any) -> tuple[str, Any, str] | None:
    """What is wrong with one step of a record, as (key, its value, what goes there), or None."""
    if not isinstance(s, dict):
        return "", s, "a step (an object)"
    if type(s.get("step")) is not int:
        return "step", s.get("step"), "the step's number, a whole number"
    seconds = s.get("time_s")
    if not (isinstance(seconds, (int, float)) and positive_number(seconds) and within("time_s", seconds)):
        return "time_s", s.get("time_s"), f"a number of seconds {spanned('time_s')}"
    return None


def bus_bandwidths(curve: Any) -> bool:
    """Whether a record's link_busbw is one bus bandwidth, or {bytes: bus bandwidth}, each within its range."""
    by_size = isinstance(curve, dict) and all(k.isdigit() for k in curve)
    figures = list(curve.values()) if by_size else [curve]
    return all(isinstance(v, (int, float)) and positive_number(v) and within("link_busbw", v) for v in figures)


def host_pass_problem(h: Any, on_gpu: bool) -> tuple[str, Any, str] | None:
    """What is wrong with a record's host pass, as (key, its value, what goes there), or None: where it says no
    why_not, its whole numbers and each part's seconds, at a rate within its span."""
    if not isinstance(h, dict):
        return "", h, "a host pass (an object)"
    if h.get("why_not") is not None:
        return ("why_not", h["why_not"], "why the host pass was not timed, in words") if not isinstance(
            h["why_not"], str) else None
    for key in HOST_WHOLE:
        if type(h.get(key)) is not int or h[key] < 1:
            return key, h.get(key), "a whole number from 1"
    for key in (*HOST_PARTS, *(("to_gpu_s",) if on_gpu else ())):
        value = h.get(key)
        if not (positive_number(value) and within("host_rate", h["elements"] / value)):
            return key, value, (f"the seconds its {h['elements']:,} elements took, at a rate "
                                f"{spanned('host_rate')}")
    return None


def record_problem(d: Any) -> tuple[str, Any, str] | None:
    """What is wrong with one RESULT record for plan.py, as (key, its value, what goes there), or None."""
    if not isinstance(d, dict):
        return "", d, "a RESULT record (an object)"
    if d.get("host_pass") is not None:
        problem = host_pass_problem(d["host_pass"], d.get("mem_kind") == "cuda")
        if problem:
            key, value, wanted = problem
            return f"host_pass{'.' + key if key else ''}", value, wanted
    for key, least in WHOLE.items():
        if d.get(key) is not None and (type(d[key]) is not int or d[key] < least):
            return key, d[key], f"a whole number from {least}"
    for key in (FOR_SPEED if d.get("steps") else ()):
        if d.get(key) is None:
            return key, d.get(key), f"a whole number from {WHOLE[key]}, as its steps' speed is worked out from it"
    for key in (*POSITIVE, "mfu"):
        if d.get(key) is not None and not positive_number(d[key]):
            return key, d[key], "a positive number"
        if d.get(key) is not None and key in RECORD_SPANS and not within(key, d[key]):
            return key, d[key], f"a number {spanned(key)}"
    for key in BOOLEAN:
        if d.get(key) is not None and type(d[key]) is not bool:
            return key, d[key], "true or false"
    curve = d.get("link_busbw")
    if curve is not None and not bus_bandwidths(curve):
        return "link_busbw", curve, f"a bus bandwidth in bytes/s {spanned('link_busbw')}, or {{bytes: bus bandwidth}}"
    if not isinstance(d.get("steps", []), list):
        return "steps", d["steps"], "a list of steps"
    for i, s in enumerate(d.get("steps") or []):
        problem = step_problem(s)
        if problem:
            key, value, wanted = problem
            return f"steps[{i}]{'.' + key if key else ''}", value, wanted
    return None


def read_records(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """summary.json's "results", read once: {run: [record]}, each record checked for the types plan.py reads; one
    line naming the file, the key and its value where one is wrong."""
    path = folder / "summary.json"
    try:
        runs = json.loads(path.read_text())["results"]
    except OSError as e:
        raise BadInput(f"--from {folder}: cannot read summary.json: {e.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"--from {folder}: summary.json holds no results") from None
    if not isinstance(runs, dict) or not all(isinstance(rs, list) for rs in runs.values()):
        raise BadInput(f"--from {path}: \"results\" must hold a list of records per run")
    if not any(runs.values()):
        raise BadInput(f"--from {path}: \"results\" holds no run's record: nothing was measured there ({MAKE_RUN})")
    for name, records in runs.items():
        for i, d in enumerate(records):
            problem = record_problem(d)
            if problem:
                key, value, wanted = problem
                raise BadInput(f"--from {path}: results.{name}[{i}]{'.' + key if key else ''} is "
                               f"{json.dumps(value)}: it must be {wanted}")
    return runs


# -----------------------------------------------------------------------------
# the compute rate of a run's steady steps


def steady_times(r: RankResult) -> list[float]:
    """A rank's steady steps' seconds: from STEADY_FROM (or after DeepCompile's last compile), not profiled."""
    first = max(STEADY_FROM, r.timed_from)
    return [s.time_s for s in r.steps if s.time_s and s.step is not None and s.step >= first and not s.comm_s]


def steady_mfu(results: list[RankResult]) -> tuple[float, int] | None:
    """A run's MFU over its steady steps, as its step lines print it (PaLM's: the model's FLOPs, not what
    checkpointing recomputes), the median over its ranks of each rank's median step, and how many steady steps
    it had (the fewest of any rank); None where no rank has one, or the run no peak or FLOPs."""
    mfus, counts = [], []
    for r in results:
        times = steady_times(r)
        tflops = r.tflops_at(statistics.median(times)) if times else None
        if tflops and r.peak_tflops:
            mfus.append(tflops / r.peak_tflops)
            counts.append(len(times))
    return (statistics.median(mfus), min(counts)) if mfus else None


@dataclass(frozen=True)
class Calibration:
    """The compute rate a plan takes from a run's steady steps, and the run it was measured on."""
    run: str  # the run's name in its folder
    mfu: float  # PaLM's MFU over its steady steps
    hfu: float  # the same with checkpointing's recomputed forward counted: the hardware's rate, which a plan carries
    steady_steps: int
    model: str | None
    seq: int | None
    micro_batch: int | None
    checkpoint: bool

    @property
    def uncertain(self) -> bool:
        return self.steady_steps < MIN_STEADY


def calibration(runs: dict[str, list[RankResult]], path: Path) -> Calibration | None:
    """The compute rate to plan with: the steady rate of the run whose hardware reached the most (the one that
    lost least to communication); None where no run has a steady step. A run whose steps would have its GPU do
    more FLOPs than its peak is refused: its FLOPs or its peak are wrong."""
    found = []
    for name, rs in runs.items():
        steady = steady_mfu(rs)
        if steady:
            r = rs[0]
            checkpoint = bool(r.run.checkpoint)
            mfu, steps = steady
            hfu = mfu * timing.hfu_per_mfu(checkpoint)
            span = SPANS["mfu"]
            if not (span.low <= mfu and hfu <= span.high):
                raise BadInput(f"--from {path}: results.{name}: its steady steps reach MFU {mfu:.3g} (HFU {hfu:.3g}), "
                               f"where from {number(span.low)} to {number(span.high)} is real: its flops_per_token "
                               f"({r.flops_per_token:g}) or peak_tflops ({r.peak_tflops:g}) is wrong")
            found.append(Calibration(name, mfu, hfu, steps, r.run.model, r.run.seq, r.run.micro_batch, checkpoint))
    return max(found, key=lambda c: c.hfu, default=None)

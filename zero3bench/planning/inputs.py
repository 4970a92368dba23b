"""
What plan.py reads, checked before it plans: each number of its command line within a range, a results folder's
records of the types that plan.py reads, and the compute rate of a run's steady steps. torch-free.
"""
import argparse
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zero3bench.options import BadInput
from zero3bench.result import RankResult

# Steps 1 to 3 are slower than the rest: step 1 allocates and selects kernels, and steps 2 and 3 ran 5 to 30%
# over the steady time on H200s (benchmarks/logs/h200/21-verdict/1-cold/results/20261201-110054-sG16: 0.366 and
# 0.348 s against a median of 0.30 over steps 4-13; h200x2/13-fsdp2/15-final5: FSDP2's 0.120 and 0.091 s against
# 0.093-0.099). The profiled last step is slower again (comm_s marks it).
STEADY_FROM = 4
# fewer steady steps than this give an MFU marked uncertain: on one H200 (26-off-default) stage 0's steps kept
# quickening to about step 25, and a 10-step run's 7 steady steps gave MFU 0.109 where a 30-step run's 27 gave 0.128
MIN_STEADY = 20
# The micro batch of a run to plan from. At 2 an H200's steps wait on the host (0.15 to 0.2 s, MFU 0.10 to 0.14), and
# a 10-step and a 30-step run gave MFUs 8 to 19% apart in three pairs; at 16 (0.40 s a step, MFU 0.44 to 0.46) two
# pairs were 2.0% and 0.9% apart (benchmarks/logs/h200/30-steady/3-steady).
PLAN_FROM_MICRO_BATCH = 16


def between(kind: type[int] | type[float], low: float, high: float, why: str,
            low_allowed: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number of kind (int or float) from low (or above it) to high; why says what
    high is."""
    def parse(text: str) -> float:
        value = kind(text)
        if not (math.isfinite(value) and (low <= value if low_allowed else low < value) and value <= high):
            span = f"from {number(low)} to" if low_allowed else f"above {number(low)} and at most"
            raise argparse.ArgumentTypeError(f"must be {span} {number(high)} ({why}), not {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def number(x: float) -> str:
    """A range's end as a user would write it: 1,048,576, or 1e+14."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e9 else f"{x:g}"


# The types of what plan.py reads of a record: whole numbers (and their least), and positive finite numbers.
WHOLE = {"rank": 0, "stage": 0, "world_size": 1, "ranks_per_node": 1, "gpus": 1, "micro_batch": 1, "seq": 1}
POSITIVE = ("device_total_bytes", "peak_tflops", "flops_per_token")


def positive_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def record_problem(d: Any) -> tuple[str, str] | None:
    """What is wrong with one RESULT record for plan.py, as (key, what goes there), or None."""
    if not isinstance(d, dict):
        return "", "a RESULT record (an object)"
    for key, least in WHOLE.items():
        if d.get(key) is not None and (type(d[key]) is not int or d[key] < least):
            return key, f"a whole number from {least}"
    for key in POSITIVE:
        if d.get(key) is not None and not positive_number(d[key]):
            return key, "a positive number"
    curve = d.get("link_busbw")
    if curve is not None and not positive_number(curve) and not (
            isinstance(curve, dict) and all(k.isdigit() and positive_number(v) for k, v in curve.items())):
        return "link_busbw", "a bus bandwidth, or {bytes: bus bandwidth}"
    if not isinstance(d.get("steps", []), list):
        return "steps", "a list of steps"
    for i, s in enumerate(d.get("steps", [])):
        if not isinstance(s, dict) or type(s.get("step")) is not int or not positive_number(s.get("time_s")):
            return f"steps[{i}]", "a step with its number (step) and its seconds (time_s)"
    return None


def read_checked(folder: Path) -> dict[str, list[RankResult]]:
    """A results folder's runs, {name: [RankResult]}, each record checked for the types plan.py reads: one
    line naming the file and the key where one is wrong."""
    path = folder / "summary.json"
    try:
        runs = json.loads(path.read_text())["results"]
    except OSError as e:
        raise BadInput(f"--from {folder}: cannot read summary.json: {e.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"--from {folder}: summary.json holds no results") from None
    if not isinstance(runs, dict) or not all(isinstance(rs, list) for rs in runs.values()):
        raise BadInput(f"--from {path}: \"results\" must hold a list of records per run")
    for name, records in runs.items():
        for i, d in enumerate(records):
            problem = record_problem(d)
            if problem:
                key, wanted = problem
                value = f" is {json.dumps(d.get(key)) if key in d else 'missing'}" if isinstance(d, dict) else ""
                raise BadInput(f"--from {path}: results.{name}[{i}]{'.' + key if key else ''}{value}: "
                               f"{wanted} goes there")
    return {name: [RankResult.from_dict(d) for d in records] for name, records in runs.items()}


def steady_times(r: RankResult) -> list[float]:
    """A rank's steady steps' seconds: from STEADY_FROM (or after DeepCompile's last compile), not profiled."""
    first = max(STEADY_FROM, r.timed_from)
    return [s.time_s for s in r.steps if s.step >= first and not s.comm_s]


def steady_mfu(results: list[RankResult]) -> tuple[float, int] | None:
    """A run's MFU over its steady steps, the median over its ranks of each rank's median step, and how many
    steady steps it had (the fewest of any rank); None where no rank has one, or the run no peak or FLOPs."""
    ranks = [(r, steady_times(r)) for r in results if r.peak_tflops and r.flops_per_token]
    mfus = [r.tflops_at(statistics.median(times)) / r.peak_tflops for r, times in ranks if times]
    if not mfus:
        return None
    return statistics.median(mfus), min(len(times) for _, times in ranks)


def calibration(runs: dict[str, list[RankResult]]) -> dict[str, Any] | None:
    """The compute rate to plan with: the steady MFU of the run that reached the highest (the one that lost
    least to communication), a third higher where it checkpointed, as plan.py's --mfu counts the recomputed
    FLOPs; with the run's name, its number of steady steps and whether they are too few to trust. None where no
    run has a steady step."""
    found = {name: steady_mfu(rs) for name, rs in runs.items() if rs}
    found = {name: f for name, f in found.items() if f}
    if not found:
        return None
    best = max(found, key=lambda name: found[name][0])
    mfu, steps = found[best]
    recompute = 4 / 3 if runs[best][0].run.checkpoint else 1
    return {"mfu": min(1.0, mfu * recompute), "run": best, "steady_steps": steps, "uncertain": steps < MIN_STEADY,
            "micro_batch": runs[best][0].run.micro_batch}

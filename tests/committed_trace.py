"""The committed GPU trace of benchmarks/logs/h200/35-trace (benchmarks/memory_timeline.py's CSV of 1.3b's stage 3 on 8
ranks rehearsed on one H200, and the RESULT lines of its log) as train_gpt.py --timeline records a traced step
(parts.Timeline): its step 3, in the order of the CSV's rows, with the record's prediction made again by today's
finishing.add_predictions, which names the moments. The CSV resets the peak at each row: the step's peak so far is
the most of the rows' peaks since its start."""
import csv
import itertools
import re
from pathlib import Path

from conftest import json_results
from zero3bench import finishing, parts, result
from zero3bench.accounting.shapes import PRESETS

TRACE = Path(__file__).resolve().parents[1] / "benchmarks" / "logs" / "h200" / "35-trace"
STEP = 3
GiB = 2**30
BF16 = 2
EVENTS = {"optimizer step": "step", "optimizer step done": "step done"}  # as timeline.Recorder names them
BLOCK = re.compile(r"^blocks\.(\d+)$")


def phases(events):
    """The phase of each row: backward from engine.backward's call to its return, the optimizer's from engine.step's,
    and forward before them."""
    phase, said = "forward", []
    for event in events:
        phase = {"backward": "backward", "optimizer step": "optimizer"}.get(event, phase)
        said.append(phase)
    return said


def point(row, phase, peak):
    module = row["where"].removesuffix(" fwd").removesuffix(" bwd")
    block = BLOCK.match(module)
    return parts.Point(phase, EVENTS.get(row["event"], row["event"]), module, int(block[1]) if block else None,
                       round(float(row["allocated_gib"]) * GiB), round(peak * GiB), round(float(row["rss_gib"]) * GiB),
                       int(row["gathered_elements"]) * BF16)


def timeline():
    rows = [r for r in csv.DictReader((TRACE / "timeline" / "stage3_r8_rank0.csv").open())
            if int(r["step"]) == STEP]
    peaks = itertools.accumulate((float(r["interval_peak_gib"]) for r in rows), max)
    points = [point(r, phase, peak) for r, phase, peak in zip(rows, phases(r["event"] for r in rows), peaks)]
    return parts.Timeline.made(step=STEP, memory="cuda", rows=[p.row() for p in points], left_out=0, hooks_s=None,
                               still_gathered=[], snapshot=None)


def rank_0():
    """Rank 0's record of the traced run, its prediction made again, and the trace."""
    r = result.RankResult.from_dict(json_results(TRACE / "timeline_stage3_r8.txt")[0])
    finishing.add_predictions(r, PRESETS[r.run.model], r.zero_config)
    r.memory_timeline = timeline()
    return r


def results_folder(folder):
    """A results folder whose stage3.log is the traced run's, with rank 0's RESULT line converted."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [result.result_line(rank_0()) if '"rank": 0,' in line and "RESULT {" in line else line
             for line in (TRACE / "timeline_stage3_r8.txt").read_text().splitlines()]
    (folder / "stage3.log").write_text("\n".join(lines) + "\n")
    return folder

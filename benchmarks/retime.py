"""
Logs written before zero3bench/result.py timed a DeepCompile run from the step after its second compile, timed as
zero3bench/result.py times them now: rank 0's result, read as a result.RankResult, with DeepCompile's timing where
the log's config turns it on. Prints each log's step time, tokens/s and peak, and its speed against the first log.
  python3 benchmarks/retime.py REFERENCE_LOG LOG ...
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench.reporting.reading import read_results  # noqa: E402


def retimed(log):
    r = read_results(log)[0]
    deepcompile = "deepcompile" in Path(r.run.config).name  # the logs predate the field
    return replace(r, run=replace(r.run, deepcompile=deepcompile))


def main(logs):
    runs = [retimed(log) for log in logs]
    for log, r in zip(logs, runs):
        compiles = {s.step: round(s.time_s, 1) for s in r.steps if s.time_s > 10 * r.step_time_s}
        print(json.dumps({"log": log, "timed_from": r.timed_from, "step_time_s": round(r.step_time_s, 4),
                          "tokens_per_s": round(r.tokens_per_s),
                          "x_first": round(r.tokens_per_s / runs[0].tokens_per_s, 3),
                          "peak_gib": round(r.peaks.peak_mem_bytes / 2**30, 2), "compile_steps_s": compiles,
                          "losses": [round(x, 4) for x in r.losses]}))


if __name__ == "__main__":
    main(sys.argv[1:])

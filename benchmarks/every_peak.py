"""
Today's predicted peak against every committed GPU peak that records its config: each rank record's most allocated
in a step (tests/test_accounting.py reads the same), and the stage-3 timelines of 29-live and 35-trace on 2 or more
bf16 ranks, their step 3's traced peak. Prints one summary line, then each miss over 2%, largest first.

    python3 benchmarks/every_peak.py > benchmarks/logs/cpu/predict/every-peak-<commit>.txt
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench import finishing, result  # noqa: E402
from zero3bench.reporting.theory import predictable  # noqa: E402

LOGS = Path(__file__).resolve().parents[1] / "benchmarks" / "logs"
TIMELINES = ("h200/29-live/*/timeline_*.txt", "h200/35-trace/timeline_*.txt")


def rank_records() -> dict[str, float]:
    misses = {}
    for summary in sorted(LOGS.glob("**/summary.json")):
        for name, records in json.loads(summary.read_text())["results"].items():
            for d in records:
                r = result.RankResult.from_dict(d)
                if predictable(r):
                    finishing.add_predictions(r, result.shape_of(r), r.zero_config or {})
                    peak = max(s.memory.peak_mem_bytes for s in r.steps)
                    misses[f"{summary.parent.relative_to(LOGS)} {name} rank {r.rank}"] = r.predicted.peak / peak - 1
    return misses


def timelines() -> dict[str, float]:
    misses = {}
    for log in sorted(p for pattern in TIMELINES for p in LOGS.glob(pattern)):
        tag = log.stem.removeprefix("timeline_")
        lines = [json.loads(line[7:]) for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        r = result.RankResult.from_dict(next(d for d in lines if d["rank"] == 0))
        if r.run.stage != 3 or r.world_size < 2 or r.run.dtype != "bf16":
            continue  # fp16's first steps skip, so step 3's peak is its first step's
        summary = (log.parent / "timeline" / f"{tag}_summary.txt").read_text()
        peak = float(summary.split("peak ")[1].split(" GiB")[0]) * 2**30
        finishing.add_predictions(r, result.shape_of(r), r.zero_config)
        misses[f"TIMELINE {log.relative_to(LOGS)}"] = r.predicted.peak / peak - 1
    return misses


def main() -> None:
    ranks, traced = rank_records(), timelines()
    every = {**ranks, **traced}
    v = list(every.values())
    print(f"{len(ranks)} rank records and {len(traced)} timelines: {sum(abs(x) <= 0.05 for x in v)} of {len(v)} "
          f"within 5%, {sum(abs(x) <= 0.02 for x in v)} within 2%; from {min(v):+.1%} to {max(v):+.1%}, "
          f"median {statistics.median(v):+.2%}")
    for key, miss in sorted(every.items(), key=lambda kv: -abs(kv[1])):
        if abs(miss) > 0.02:
            print(f"{miss:+.1%} {key}")


if __name__ == "__main__":
    main()

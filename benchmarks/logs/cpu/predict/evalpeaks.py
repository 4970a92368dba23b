import json, sys, statistics
sys.path.insert(0, '.'); sys.path.insert(0, 'tests')
from pathlib import Path
from zero3bench import result
from zero3bench.accounting import shapes as t
LOGS = Path('benchmarks/logs')
def records(folder):
    for summary in sorted(folder.glob("**/summary.json")):
        for rs in json.loads(summary.read_text())["results"].values():
            yield from ((summary, result.RankResult.from_dict(d)) for d in rs)
def predictable(r):
    config = r.zero_config or r.run.engine == "fsdp2"
    return r.mem_kind == "cuda" and r.steps and not r.oom and r.model_state_breakdown and config
out = {}
for summary, r in records(LOGS):
    if not predictable(r): continue
    result.add_predictions(r, t.PRESETS[r.run.model], t.LOSS_CHUNK, r.zero_config or {})
    peak = max(s.memory.peak_mem_bytes for s in r.steps)
    out[f"{summary.relative_to(LOGS)}|{r.run.run_label if hasattr(r.run,'run_label') else ''}|{r.rank}|s{r.run.stage}|G{r.world_size}|{r.run.model}|mb{r.run.micro_batch}|ck{r.run.checkpoint}|{r.run.dtype}|{r.run.engine}|{r.run.offload}"] = r.predicted.peak / peak - 1
for log in sorted((LOGS/'h200'/'29-live').glob("*/timeline_*.txt")) + sorted((LOGS/'h200'/'35-trace').glob("timeline_*.txt")):
    tag = log.stem.removeprefix("timeline_")
    summ = log.parent / "timeline" / f"{tag}_summary.txt"
    lines = [json.loads(l[7:]) for l in log.read_text().splitlines() if l.startswith("RESULT ")]
    r = result.RankResult.from_dict(next(d for d in lines if d["rank"] == 0))
    if r.run.stage != 3 or r.world_size < 2 or r.run.dtype != "bf16": continue
    peak = float(summ.read_text().split("peak ")[1].split(" GiB")[0]) * 2**30
    result.add_predictions(r, t.PRESETS[r.run.model], t.LOSS_CHUNK, r.zero_config)
    out["TIMELINE|" + str(log.relative_to(LOGS))] = r.predicted.peak / peak - 1
json.dump(out, open(sys.argv[1], 'w'), indent=0)
v = list(out.values())
print(len(v), "max", max(v), "min", min(v), "median", statistics.median(v), "within2%", sum(abs(x) <= .02 for x in v), "over5%", {k: round(x,3) for k, x in out.items() if abs(x) > .05})
for k, x in out.items():
    if k.startswith("TIMELINE"): print(k, round(x, 4))

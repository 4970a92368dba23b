"""
Every committed Hugging Face run on GPUs (an H100's or an H200's folders) against today's prediction,
memory.rank_memory from what each rank counted and what its model keeps for backward: as the record counted it on
its GPU, with the kernels PyTorch chose there (records from issue 56 on), else counted again here at the run's
settings from its config (zero3bench/hf.py), with saved.cuda_rule's kernels. Prints docs/hugging-face.md's table,
one row per results folder (each stage's peak, measured and predicted, the largest misses of the peak and of the
model states over its ranks, and the verdict), then each rank's misses. A folder is a Hugging Face run's where its
records carry a shape (parts.Built.shape).

    python3 benchmarks/hf_peaks.py > benchmarks/logs/cpu/predict/hf-peaks-<commit>.txt
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench import finishing, inputs, result  # noqa: E402
from zero3bench.accounting.shapes import ModelShape  # noqa: E402

LOGS = ROOT / "benchmarks" / "logs"
GIB = 2**30
HEADER = ["| GPU | model | ranks | checkpointing | peak by stage, measured / predicted GiB | largest miss: peak | "
          "model states | counted | verdict |", "|---|---|---|---|---|---|---|---|---|"]


def hf_folders() -> list[Path]:
    """The results folders of GPU runs whose records carry a Hugging Face model's shape, where a rank counted it."""
    found = []
    for summary in sorted(LOGS.glob("h[12]00*/**/summary.json")):
        records = [d for rs in json.loads(summary.read_text())["results"].values() for d in rs]
        if (records and all((d.get("built") or {}).get("shape") for d in records)
                and any(d.get("params_total") for d in records)):
            found.append(summary.parent)
    return found


def counted_shape(r: result.RankResult) -> tuple[ModelShape, str]:
    """The shape whose count predicts the record, and where the count was made."""
    shape = result.shape_of(r)
    if shape.saved:
        return shape, "on its GPU"
    return inputs.counted(r.run.model, r.run.seq, r.run.dtype, on_gpu=True), "here, CUDA's rule"


def predicted(r: result.RankResult) -> tuple[result.RankResult, str]:
    shape, where = counted_shape(r)
    finishing.add_predictions(r, shape, r.zero_config or {})
    return r, f"{', '.join(s.attention for s in shape.saved) or shape.not_counted} ({where})"


def peak(r: result.RankResult) -> int:
    """The most allocated in a step (tests/test_accounting.py's training_peak)."""
    return max(s.memory.peak_mem_bytes for s in r.steps)


def largest(misses: list[float | None]) -> str:
    known = [m for m in misses if m is not None]
    return "not predicted" if len(known) < len(misses) else f"{round(max(known, key=abs), 3) or 0.0:+.1%}"


def row(folder: Path) -> tuple[str, list[str]]:
    """The folder's row of the table, and a line for each of its rank records."""
    # a rank stopped before it counted its model (h200/46-families' GPT-2 XL) has nothing to predict
    runs = {name: [predicted(r) for r in map(result.RankResult.from_dict, rs) if r.shards.params_total]
            for name, rs in json.loads((folder / "summary.json").read_text())["results"].items()}
    out = subprocess.run([sys.executable, "report.py", str(folder)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    stages, peaks, states, lines, kernels = [], [], [], [], set()
    for name, records in runs.items():
        if not records:  # a run stopped before its record, or before it counted its model
            stages.append(f"{name.removeprefix('stage')}: no result")
            continue
        stages.append(f"{name.removeprefix('stage')}: {max(map(peak, (r for r, _ in records))) / GIB:.2f} / "
                      f"{max(r.predicted.peak or 0 for r, _ in records) / GIB:.2f}")
        for r, kernel in records:
            peaks.append(None if r.predicted.peak is None else r.predicted.peak / peak(r) - 1)
            states.append(r.predicted.states / r.model_state_bytes - 1)
            kernels.add(kernel)
            lines.append(f"{folder.relative_to(LOGS)} {name} rank {r.rank}: peak "
                         f"{'not predicted' if peaks[-1] is None else f'{peaks[-1]:+.2%}'}, states {states[-1]:+.2%}, "
                         f"attention {kernel}")
    first = next(r for records in runs.values() for r, _ in records)
    model = Path(first.run.model).stem if first.run.model.endswith(".json") else first.run.model
    ranks = f"{first.world_size} rehearsed" if first.rehearsal else str(first.world_size)
    verdict = re.search(r"^VERDICT: (.+)$", out, re.M).group(1)
    gpu = folder.relative_to(LOGS).parts[0].upper()
    return (f"| {gpu} | {model} | {ranks} | {'on' if first.run.checkpoint else 'off'} | {', '.join(stages)} | "
            f"{largest(peaks)} | {largest(states)} | {'; '.join(sorted(kernels))} | {verdict} |"), lines


def main() -> None:
    rows = [row(folder) for folder in hf_folders()]
    print(*HEADER, *(text for text, _ in rows), sep="\n")
    for _, lines in rows:
        print(*lines, sep="\n")


if __name__ == "__main__":
    main()

"""
Each tiny config of tests/models through `bash run.sh --model CONFIG` on this machine's CPU ranks (stages 0 and 3, 2
ranks): its model states against the prediction (the report's error row), its verdict, and what its forward saves
for backward, found with saved_tensors_hooks on this CPU in bf16 at micro batch 3, against the count on the meta
device (tests/test_hf.py's test, in numbers). Prints one row per config; run.sh's folders stay in OUT_DIR. With
FAMILY names, the configs of benchmarks/families.json instead (benchmarks/heldout_saved.py's).

    python3 benchmarks/cpu_families.py OUT_DIR [FAMILY ...] > benchmarks/logs/cpu/hf-families/families-<commit>.txt
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench import hf, inputs  # noqa: E402
from zero3bench.accounting import memory  # noqa: E402


def saved_on_this_cpu(path: str, micro_batch: int = 3, seq: int = 64) -> tuple[int, int, str]:
    """The bytes that one forward saves for backward here, and those that the count predicts, and its kernels."""
    import transformers
    shape = inputs.counted(path, seq, "bf16", False)
    _, config = inputs.chosen(path)
    with hf.quiet():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              attn_implementation=hf.attention(config))
    model.train()
    ids = torch.arange(micro_batch * seq).remainder(config.vocab_size).view(micro_batch, seq)
    given = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), ids]}
    saved, held = {}, []

    def pack(tensor: torch.Tensor) -> torch.Tensor:  # each storage held: one freed would free its address for another
        held.append(tensor.untyped_storage())
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids, use_cache=False).logits
    counted = sum(n for ptr, n in saved.items() if ptr not in given | {logits.untyped_storage().data_ptr()})
    return counted, memory.kept_at(shape, "bf16", micro_batch, seq, on_gpu=False).total, shape.saved[0].attention


def through_run_sh(path: str, out: Path) -> tuple[str, str, str]:
    """The report's model states row, its error row and the verdict."""
    done = subprocess.run(["bash", "run.sh", "--model", path], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "RESULTS": str(out)}, timeout=900)
    states = re.search(r"^model states +(\S+ \S+) +(\S+ \S+).*\n  predicted .*\n  error +(\S+) +(\S+)", done.stdout,
                       re.M)
    verdict = re.search(r"^VERDICT: (.+)$", done.stdout, re.M)
    if not states:
        return "-", "-", verdict.group(1) if verdict else f"exit {done.returncode}"
    return f"{states[1]}, {states[2]}", f"{states[3]}, {states[4]}", verdict.group(1) if verdict else "-"


def configs(out: Path, families: list[str]) -> list[str]:
    """tests/models' configs, else the families' of benchmarks/families.json, written to out."""
    if not families:
        return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "models").glob("*.json"))
    written = json.loads((ROOT / "benchmarks" / "families.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for family in families:
        (out / f"{family}.json").write_text(json.dumps(written[family]))
    return [str(out / f"{family}.json") for family in families]


def main() -> None:
    out = Path(sys.argv[1])
    print("| config | saved on this CPU, bytes | counted | model states, stage 0 and 3 | error | verdict |")
    print("|---|---|---|---|---|---|")
    for path in configs(out, sys.argv[2:]):
        counted, predicted, kernels = saved_on_this_cpu(path)
        states, error, verdict = through_run_sh(path, out)
        print(f"| {Path(path).stem} | {counted:,} | {predicted:,} ({kernels}) | {states} | {error} | {verdict} |",
              flush=True)


if __name__ == "__main__":
    main()

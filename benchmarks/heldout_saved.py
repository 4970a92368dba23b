"""
Families that tests/models holds no config of: the 80 tiny configs of benchmarks/families.json, which a held-out
battery wrote by hand (2 layers, width 64, a vocabulary of 512; a family's own defaults kept, dropout among them),
else each FAMILY given as transformers' own defaults cut down (heldout_families.tiny_config). For each, its parameters
against the model built, and what one forward saves for backward in bf16 on this CPU at micro batch 3, found with
saved_tensors_hooks, against the count on the meta device at micro batches 1 and 2 (zero3bench/saved.py), and the
shape's fields as read; or its one-line refusal, or why it is not counted. One line a config, then the tally.

    python3 benchmarks/heldout_saved.py [FAMILY ...] > benchmarks/logs/cpu/hf-heldout/saved-<commit>.txt
"""
import collections
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_families import saved_on_this_cpu  # noqa: E402
from heldout_families import tiny_config  # noqa: E402
from zero3bench import hf, inputs  # noqa: E402
from zero3bench.options import BadInput  # noqa: E402


FAMILIES = Path(__file__).resolve().parent / "families.json"


def configs(families: list[str]) -> dict[str, dict]:
    return {f: tiny_config(f, {}) for f in families} if families else json.loads(FAMILIES.read_text())


def outcome(path: Path) -> tuple[str, str]:
    """The config's kind of outcome (refused, not counted, DIFFERENT, or params and saved the same) and its line:
    its parameters against the built model's and its count against this CPU's forward."""
    import transformers
    try:
        shape, config = inputs.chosen(str(path))
        counted_shape = inputs.counted(str(path), 64, "bf16", False)
    except BadInput as e:
        return "refused", f"refused: {e}"
    with hf.quiet():
        built = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    params = f"params {shape.params:,} {'as built' if built == shape.params else f'DIFFERENT: built {built:,}'}"
    if not counted_shape.saved:
        return "not counted", f"{params}; not counted: {counted_shape.not_counted}"
    found, counted, kernels = saved_on_this_cpu(str(path))
    fields = {k: getattr(shape, k) for k in ("mlp", "experts", "top_k", "positions", "norm_kind", "dropout")}
    same = found == counted and built == shape.params
    return ("params and saved the same" if same else "DIFFERENT",
            f"{params}; saved {found:,} bytes, counted {counted:,} ({kernels}): "
            f"{'the same' if found == counted else 'DIFFERENT'}; parallel {counted_shape.parallel}; {fields}")


def main() -> None:
    folder, tally = Path(tempfile.mkdtemp()), collections.Counter()
    for family, config in configs(sys.argv[1:]).items():
        path = folder / f"{family}.json"
        path.write_text(json.dumps(config))
        kind, line = outcome(path)
        tally[kind] += 1
        print(f"{family}: {line}", flush=True)
    print(", ".join(f"{n} {what}" for what, n in tally.most_common()))


if __name__ == "__main__":
    main()

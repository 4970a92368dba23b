"""
Families that tests/models holds no config of, each as transformers' own defaults cut down
(heldout_families.tiny_config): what one forward saves for backward in bf16 on this CPU at micro batch 3, found with
saved_tensors_hooks, against the count on the meta device at micro batches 1 and 2 (zero3bench/saved.py), and the
shape's fields as read. One line a family.

    python3 benchmarks/heldout_saved.py FAMILY ... > benchmarks/logs/cpu/hf-heldout/saved-<commit>.txt
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_families import saved_on_this_cpu  # noqa: E402
from heldout_families import tiny_config  # noqa: E402
from zero3bench import inputs  # noqa: E402
from zero3bench.options import BadInput  # noqa: E402


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    for family in sys.argv[1:]:
        path = folder / f"{family}.json"
        path.write_text(json.dumps(tiny_config(family, {})))
        try:
            shape = inputs.counted(str(path), 64, "bf16", False)
            if not shape.saved:
                print(f"{family}: not counted: {shape.not_counted}")
                continue
            found, counted, kernels = saved_on_this_cpu(str(path))
        except BadInput as e:
            print(f"{family}: refused: {e}")
            continue
        fields = {k: getattr(shape, k) for k in ("mlp", "experts", "top_k", "parallel", "positions", "norm_kind")}
        print(f"{family}: saved {found:,} bytes, counted {counted:,} ({kernels}): "
              f"{'the same' if found == counted else 'DIFFERENT'}; {fields}", flush=True)


if __name__ == "__main__":
    main()

"""The seed sweep behind verdict (c) on the H200 (benchmarks/logs/h200/21-verdict): one row per run of stages 0 and 3,
with the losses on the first batch, how far the stages are apart, and the verdict's (c).

    python3 benchmarks/verdict_sweep.py benchmarks/logs/h200/21-verdict"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench.formatting import format_table  # noqa: E402
from zero3bench.reporting import losses, reading  # noqa: E402


def row(folder):
    runs = reading.load_runs(folder)
    dense, zero3 = runs.get("stage0"), runs.get("stage3")
    if not dense or not zero3:
        return None
    status, _ = losses.loss(dense, zero3)
    a, b = dense[0], zero3[0]
    apart = losses.weights_apart(a, b) if not reading.failed(dense) and not reading.failed(zero3) else None
    trail = " -> ".join(f"{x:.3f}" for x in a.losses or [])
    return (a.run.seed, a.world_size, trail or reading.status(dense), status,
            f"{losses.largest_gap(a.losses, b.losses):.1e}" if apart is not None else "-",
            f"{apart:.1e}" if apart is not None else "-", folder)


def main(top):
    rows = [r for r in (row(f) for f in sorted(Path(top).glob("*/results/*"))) if r]
    rows.sort(key=lambda r: (r[1], r[0]))
    print(format_table([("seed", "ranks", "stage 0 losses", "(c)", "loss gap", "weights gap", "folder"), *rows]))


if __name__ == "__main__":
    main(*sys.argv[1:])

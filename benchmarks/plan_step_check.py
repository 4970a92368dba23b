"""
The world-1 step time that zero3bench/planning/steptime.py plans from one calibrating run, against every world-1
run of the results folders given (issue 47, item 1: within 15%), as a markdown table.
  python3 benchmarks/plan_step_check.py CALIBRATING_FOLDER FOLDER ...
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench.planning import steptime  # noqa: E402

TOLERANCE = 0.15


def rows(cal: Path, folders: list[Path]) -> list[tuple[str, int, bool, float, float]]:
    t = steptime.terms(cal)
    out = []
    for folder in folders:
        for m in steptime.measured(folder).values():
            planned = steptime.step_s(t, m, m.setup, m.micro_batch, m.checkpoint)
            out.append((m.setup, m.micro_batch, m.checkpoint, planned, m.step_s))
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def main() -> int:
    cal, *folders = (Path(a) for a in sys.argv[1:])
    table = rows(cal, folders)
    print(f"calibrating run: {cal}\n\n| setup | micro batch | checkpointing | planned s | measured s | error |")
    print("|---|---|---|---|---|---|")
    for setup, mb, ck, planned, step in table:
        print(f"| {setup} | {mb} | {'on' if ck else 'off'} | {planned:.3f} | {step:.3f} | {planned / step - 1:+.1%} |")
    worst = max(abs(p / s - 1) for *_, p, s in table)
    print(f"\nworst {worst:.1%} over {len(table)} runs (at most {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())

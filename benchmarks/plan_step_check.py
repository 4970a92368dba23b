"""
The world-1 step time that zero3bench/planning/steptime.py plans from one calibrating run, against every world-1
run of the results folders given (issue 47, item 1: within 15%), as a markdown table: the terms the run set, and
each run's planned step with the clock that holds it.
  python3 benchmarks/plan_step_check.py CALIBRATING_FOLDER FOLDER ...
"""
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench.planning import steptime  # noqa: E402

TOLERANCE = 0.15


@dataclass(frozen=True)
class Row:
    folder: str
    setup: str
    micro_batch: int
    checkpoint: bool
    planned_s: float
    measured_s: float
    holds: str  # the clock that holds the passes: "host" or "GPU"

    @property
    def error(self) -> float:
        return self.planned_s / self.measured_s - 1


def rows(t: steptime.Terms, folders: list[Path]) -> list[Row]:
    out = []
    for folder in folders:
        for m in steptime.measured(folder).values():
            gpu = steptime.gpu_s(m, m.micro_batch, m.checkpoint, t.gpu_flops_per_s)
            holds = "host" if steptime.host_s(t, m, m.checkpoint) > gpu else "GPU"
            out.append(Row(folder.name, m.setup, m.micro_batch, m.checkpoint,
                           steptime.step_s(t, m, m.micro_batch, m.checkpoint), m.step_s, holds))
    return sorted(out, key=lambda r: (r.setup, r.micro_batch, r.checkpoint))


def main() -> int:
    cal, *folders = (Path(a) for a in sys.argv[1:])
    t = steptime.terms(cal)
    own = ", ".join(f"stage {stage} {s * 1e6:.0f}" for stage, s in t.own_s_per_tensor.items())
    adam = ", ".join(f"{setup} {s:.3f} s" for setup, s in t.host_step_s.items())
    print(f"calibrating run: {cal}\nGPU {t.gpu_flops_per_s / 1e12:.1f} TFLOP/s; launches "
          f"{t.launch_s_per_tensor_pass * 1e6:.0f} us per tensor per pass; own cost per tensor (us): {own}; "
          f"CPU Adam on {steptime.HOST_CORES} cores: {adam}\n")
    table = rows(t, folders)
    print("| run | setup | micro batch | checkpointing | held by | planned s | measured s | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r.folder[-4:]} | {r.setup} | {r.micro_batch} | {'on' if r.checkpoint else 'off'} | {r.holds} | "
              f"{r.planned_s:.3f} | {r.measured_s:.3f} | {r.error:+.1%} |")
    worst = max(abs(r.error) for r in table)
    print(f"\nworst {worst:.1%} over {len(table)} runs (at most {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())

"""
What --timeline costs a step (issue 59): train_gpt.py on 2 ranks with and without it, in turns, REPEATS times each;
rank 0's first and last steps (the ones --timeline traces) against the same steps untraced, and the hooks' own
seconds that the record holds.
    python3 benchmarks/timeline_cost.py [train_gpt.py options]     # e.g. --stage 3 --steps 4
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench.machine import free_port  # noqa: E402

REPEATS = 3


def rank_0(args):
    """Rank 0's RESULT record of one launch."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), "train_gpt.py", *args], cwd=ROOT, capture_output=True, text=True)
    found = [json.loads(line.partition("RESULT ")[2]) for line in out.stdout.splitlines() if "RESULT {" in line]
    return next(r for r in found if r["rank"] == 0)


def main(args):
    times = {"without": [], "with": []}
    hooks = []
    for _ in range(REPEATS):
        for kind, extra in (("without", []), ("with", ["--timeline"])):
            r = rank_0([*args, *extra])
            times[kind].append([s["time_s"] for s in r["steps"]])
            if extra:
                hooks.append(r["memory_timeline"]["hooks_s"])
                points = len(r["memory_timeline"]["rows"])
    print(f"train_gpt.py {' '.join(args)} on 2 ranks, {REPEATS} launches each; rank 0's step times (s):")
    for kind, runs in times.items():
        print(f"  {kind:7} --timeline: " + "; ".join(" ".join(f"{t:.3f}" for t in steps) for steps in runs))
    for name, at in (("first", 0), ("last", -1)):
        untraced = statistics.median(steps[at] for steps in times["without"])
        traced = statistics.median(steps[at] for steps in times["with"])
        print(f"{name} step, median: {untraced:.3f} s untraced, {traced:.3f} s traced ({traced / untraced - 1:+.1%})")
    print(f"the hooks' own seconds in the last traced step ({points} points): "
          + ", ".join(f"{h:.4f}" for h in hooks))


if __name__ == "__main__":
    main(sys.argv[1:])

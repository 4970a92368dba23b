"""
plan.py's step on 2 GPUs of one node, from a one-GPU calibrating run (its world-1 steps, steptime.py, with the
collectives over the link), against the committed 2-H200 runs of benchmarks/logs/h200x2/13-fsdp2/15-final5, the
newest there (issue 47, item 1: within 20%). The 2-GPU runs were made on another machine than the calibrating
ones, in another session.
  python3 benchmarks/plan_two_gpus.py CALIBRATING_FOLDER ...
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWO = sorted((ROOT / "benchmarks/logs/h200x2/13-fsdp2/15-final5/r").glob("*/summary.json"))
TOLERANCE = 0.20


def planned(calibrating: str, micro_batch: int, checkpoint: bool) -> dict[str, dict]:
    argv = [sys.executable, "plan.py", "--from", calibrating, "--gpus", "2", "--gpus-per-node", "2", "--stages", "0",
            "3", "fsdp2", "--micro-batch", str(micro_batch), "--checkpoint" if checkpoint else "--no-checkpoint",
            "--json"]
    rows = json.loads(subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout)["rows"]
    return {r["setup"]: r for r in rows}


def main() -> None:
    worst = {}
    for calibrating in sys.argv[1:]:
        print(f"calibrating run: {calibrating}\n")
        print("| 2-GPU run | setup | micro batch | checkpointing | planned s (overlap / serial) | measured s | error |")
        print("|---|---|---|---|---|---|---|")
        for summary in TWO:
            for name, records in json.loads(summary.read_text())["results"].items():
                r = records[0]
                setup = name.removeprefix("stage")
                if setup not in ("0", "3", "fsdp2"):
                    continue
                row = planned(calibrating, r["micro_batch"], r["checkpoint"])[setup]
                error = row["step_s"]["overlapped"] / r["step_time_s"] - 1
                worst[calibrating] = max(worst.get(calibrating, 0), abs(error))
                print(f"| {summary.parent.name} | {setup} | {r['micro_batch']} | {'on' if r['checkpoint'] else 'off'} | "
                      f"{row['step_s']['overlapped']:.3f} / {row['step_s']['serial']:.3f} | {r['step_time_s']:.3f} | "
                      f"{error:+.1%} |")
        print(f"\nworst {worst[calibrating]:.1%} (at most {TOLERANCE:.0%})\n")


if __name__ == "__main__":
    main()

"""
Offload's step at world 1 as plan.py plans it from a calibrating folder's stages 0 and 3 alone, as the README's
command (bash run.sh --ranks 1 --steps 30 --micro-batch 16) makes them, against the offload runs measured (issue 57,
item 2: within 15%). The calibrating folder's other runs are left out of a copy of its summary.json, so that an
offload run in it is held out too. Per run: the planned step and its parts (the passes, the copies over the host
link, the host pass and whether it was measured or assumed), the measured step (the median of its steady steps:
4 on, not the profiled last) and what that leaves for the host after the planned passes and copies.
With --host-of-each-run, each run is planned with the host pass that its own probe measured after it trained (the
record's host_pass, as a calibrating run on its host records it) in place of the calibrating folder's: for offload
runs made on another host of the same kind than the calibrating one.
  python3 benchmarks/plan_offload_check.py [--host-of-each-run] CALIBRATING_FOLDER FOLDER ...   # FOLDER: results
  folders, or their parent
"""
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench.planning.inputs import STEADY_FROM  # noqa: E402

TOLERANCE = 0.15
FLAGS = {"stage3_offload": "--offload", "stage3_infinity": "--offload-param"}


@dataclass(frozen=True)
class Row:
    run: str
    setup: str
    model: str
    micro_batch: int
    checkpoint: bool
    planned_s: float
    passes_s: float
    copies_s: float
    host_pass_s: float
    assumed: bool
    measured_s: float

    @property
    def error(self) -> float:
        return self.planned_s / self.measured_s - 1

    @property
    def host_left_s(self) -> float:
        """What the measured step leaves for the host after the planned passes and copies."""
        return self.measured_s - self.passes_s - self.copies_s


def steady(record: dict) -> float | None:
    times = [s["time_s"] for s in record["steps"] if s["step"] >= STEADY_FROM and not s.get("comm_s")]
    return statistics.median(times) if times else None


def calibrating_copy(folder: Path, into: Path, host_pass: dict | None = None) -> Path:
    """The folder's stages 0 and 3 alone, in a summary.json of their own; with host_pass, as each record's."""
    runs = json.loads((folder / "summary.json").read_text())["results"]
    kept = {k: [{**r, "host_pass": host_pass} if host_pass else r for r in runs[k]]
            for k in ("stage0", "stage3") if k in runs}
    into.mkdir()
    (into / "summary.json").write_text(json.dumps({"results": kept}))
    return into


def summaries(paths: list[Path]) -> list[Path]:
    found = [p / "summary.json" if (p / "summary.json").exists() else None for p in paths]
    return sorted({s for p, f in zip(paths, found) for s in ([f] if f else p.glob("*/summary.json"))})


def plan_of(calibrating: Path, name: str, r: dict) -> dict:
    argv = [sys.executable, "plan.py", "--from", str(calibrating), "--preset", r["model"], "--gpus", "1", "--stages",
            "3", FLAGS[name], "--micro-batch", str(r["micro_batch"]),
            "--checkpoint" if r["checkpoint"] else "--no-checkpoint", "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[1:])}: exit {proc.returncode}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def rows(given: Path, into: Path, model: str, folders: list[Path], own_host: bool) -> tuple[list[Row], dict]:
    out, host = [], {}
    calibrating = None if own_host else calibrating_copy(given, into / given.name)
    for summary in summaries(folders):
        for name, records in json.loads(summary.read_text())["results"].items():
            r = records[0] if records else {}
            if name not in FLAGS or r.get("world_size") != 1 or r.get("model") != model or steady(r) is None:
                continue
            if own_host:
                calibrating = calibrating_copy(given, into / f"{summary.parent.name}-{name}", r["host_pass"])
            p = plan_of(calibrating, name, r)
            [planned] = p["rows"]
            host = p["host_pass"]
            out.append(Row(summary.parent.name, name.removeprefix("stage"), model, r["micro_batch"], r["checkpoint"],
                           planned["step_s"]["overlapped"], planned["compute_s"], planned["comm_s"],
                           planned["host_pass_s"], host["sources"][name.removeprefix("stage")].startswith("assumed"),
                           steady(r)))
    return sorted(out, key=lambda x: (x.setup, x.micro_batch, x.checkpoint, x.run)), host


def main() -> int:
    own_host = "--host-of-each-run" in sys.argv
    given, *folders = (Path(a) for a in sys.argv[1:] if a != "--host-of-each-run")
    model = json.loads((given / "summary.json").read_text())["results"]["stage0"][0]["model"]
    with tempfile.TemporaryDirectory() as tmp:
        table, host = rows(given, Path(tmp), model, [given, *folders], own_host)
    print(f"calibrating: {given} (its stages 0 and 3 alone), {model}"
          + ("; each run's host pass from its own probe, on its host" if own_host else ""))
    for setup, source in host.get("sources", {}).items():
        print(f"  host pass {setup}: {host['core_s'][setup]:.4g} core-s per element on {host['cores']} cores: {source}")
    print("\n| run | setup | micro batch | checkpointing | planned s | measured s | error | passes s | copies s | "
          "host pass s planned | left for the host s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r.run[-4:]} | {r.setup} | {r.micro_batch} | {'on' if r.checkpoint else 'off'} | {r.planned_s:.3f} | "
              f"{r.measured_s:.3f} | {r.error:+.1%} | {r.passes_s:.3f} | {r.copies_s:.3f} | {r.host_pass_s:.3f}"
              f"{' assumed' if r.assumed else ''} | {r.host_left_s:.3f} |")
    if not table:
        print(f"\nno offload run of {model} at world 1 with a steady step")
        return 1
    worst = max(abs(r.error) for r in table)
    print(f"\nworst {worst:.1%} over {len(table)} runs (at most {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())

"""
Does recording the CUDA allocator's history (torch.cuda.memory._record_memory_history, which PyTorch's memory viewer
reads) break a training step with the installed torch and DeepSpeed? On 2 H200s, torch 2.11.0 and DeepSpeed 0.19.8,
it made cross_entropy_loss return NULL ("SystemError: ... returned NULL without setting an exception") in the
checkpoint's recompute of stage 3's backward (benchmarks/logs/h200x2/13-fsdp2/12-memory); on an H100 in all three
cases below, without DeepSpeed too (benchmarks/logs/h100/3-timeline/snapshot_repro.txt), and zero3bench.timeline
refuses --timeline=snapshot with torch 2.11 (SNAPSHOT_BREAKS). One GPU, about 30 s; three cases at once, each a process of its own:

  torch, Python stacks   model.py's GPT (checkpointed blocks, the loss recomputed chunk by chunk) one step on the GPU,
                         without DeepSpeed, recording as profile_step.py did (stacks="python")
  torch, all stacks      the same, recording as train_gpt.py does (torch's default: Python and C++ stacks)
  ZeRO-3, 2 ranks        train_gpt.py --timeline=snapshot, stage 3 on 2 ranks rehearsed on the GPU over gloo, as run.sh's
                         default runs, SNAPSHOT_BREAKS set aside: its own recording, dumped per rank

    python3 benchmarks/snapshot_repro.py [OUT_DIR]     # each case's log in OUT_DIR (default snapshot_repro/)

Each case says ok, with its snapshot's size, or BROKE, with its error's first line; the last line says whether the
snapshot works with these versions (exit 0), or that it breaks (exit 1). The snapshots are written to a temporary
folder and removed: their size alone is reported.
"""
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ERROR = re.compile(r"^\w*(Error|Exception): ")  # a traceback's last line: the error that ended a case
MODEL = "125m"
CASES = {
    "torch, Python stacks": [sys.executable, __file__, "--torch", "python"],
    "torch, all stacks": [sys.executable, __file__, "--torch", "all"],
    "ZeRO-3, 2 ranks": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        "29517", __file__, "--train", "--stage", "3", "--model", MODEL, "--steps", "2",
                        "--timeline=snapshot"],
}


def torch_step(stacks: str, out: Path) -> None:
    """One step of model.py's GPT on the GPU, in bf16, with the allocator's history recorded."""
    import torch
    sys.path.insert(0, str(ROOT))
    from model import GPT
    from zero3bench.accounting.shapes import PRESETS
    torch.set_default_dtype(torch.bfloat16)
    model = GPT(PRESETS[MODEL], checkpoint=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    tokens = torch.randint(0, PRESETS[MODEL].vocab, (2, 1025), device="cuda")
    torch.cuda.memory._record_memory_history(stacks=stacks, max_entries=200_000)
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(out / "torch.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)


def zero3_step() -> None:
    """train_gpt.py as run.sh launches it, with the refusal of SNAPSHOT_BREAKS set aside."""
    sys.path.insert(0, str(ROOT))
    from zero3bench import timeline
    timeline.SNAPSHOT_BREAKS.clear()
    import train_gpt
    train_gpt.main(sys.argv[2:])


def said(log: Path, status: int, snapshots: list[Path]) -> str:
    """A case's outcome in one line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if "RESULT {" not in line]
    errors = [line for line in lines if ERROR.match(line)]
    if status == 0 and snapshots:
        return f"ok, snapshot {sum(p.stat().st_size for p in snapshots) / 2**20:.1f} MiB ({len(snapshots)} file(s))"
    return f"BROKE (exit {status}): {errors[0][:300] if errors else f'no error line; see {log}'}"


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("snapshot_repro.py: error: the allocator's history is the GPU's: this machine has none", file=sys.stderr)
        return 2
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "snapshot_repro")
    out.mkdir(parents=True, exist_ok=True)
    versions = f"torch {torch.__version__} and DeepSpeed {metadata.version('deepspeed')} on {torch.cuda.get_device_name()}"
    print(f"recording the allocator's history with {versions}", flush=True)
    started, outcomes = time.perf_counter(), {}
    with tempfile.TemporaryDirectory() as snapshots:
        folders = {name: Path(snapshots) / str(i) for i, name in enumerate(CASES)}
        procs = {}
        for name, command in CASES.items():
            folders[name].mkdir()
            env = {**os.environ, "ZERO3_BENCH_RUN": str(folders[name]), "SNAPSHOT_OUT": str(folders[name])}
            log = out / f"{len(procs) + 1}-{'-'.join(name.replace(',', '').lower().split())}.log"
            procs[name] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"),
                                            stderr=subprocess.STDOUT), log)
        for name, (proc, log) in procs.items():
            outcomes[name] = said(log, proc.wait(timeout=300), sorted(folders[name].glob("*.pickle")))
            print(f"  {name}: {outcomes[name]}", flush=True)
    broke = [name for name, outcome in outcomes.items() if outcome.startswith("BROKE")]
    print(f"SNAPSHOT: {'BREAKS' if broke else 'works'} with {versions}"
          + (f" ({', '.join(broke)})" if broke else "") + f"; {time.perf_counter() - started:.0f} s")
    return 1 if broke else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torch"]:
        torch_step(sys.argv[2], Path(os.environ["SNAPSHOT_OUT"]))
    elif sys.argv[1:2] == ["--train"]:
        zero3_step()
    else:
        sys.exit(main())
